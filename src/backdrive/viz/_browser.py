"""Screenshots of saved previews in headless Chromium (for tests, docs and thumbnails)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

__all__ = ["find_chromium", "screenshot", "BrowserNotFoundError"]

_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


class BrowserNotFoundError(FileNotFoundError):
    """No Chromium-family browser was found to take a screenshot with."""


def find_chromium() -> str:
    """Path of a Chromium-family browser: ``$BACKDRIVE_CHROMIUM``, else the first on ``PATH``.

    Raises:
        BrowserNotFoundError: naming the Debian package to install.
    """
    env = os.environ.get("BACKDRIVE_CHROMIUM")
    if env:
        if shutil.which(env) is None:
            raise BrowserNotFoundError(f"BACKDRIVE_CHROMIUM={env!r} is not an executable")
        return shutil.which(env)  # type: ignore[return-value]
    for name in _CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    raise BrowserNotFoundError(
        "no Chromium found (tried " + ", ".join(_CANDIDATES) + "); on Debian: "
        "apt-get update && apt-get install -y chromium, or set BACKDRIVE_CHROMIUM"
    )


def screenshot(
    page,
    png,
    *,
    t: float | None = None,
    size: tuple[int, int] = (960, 720),
    wait_ms: int = 4000,
    offline: bool = True,
    quiet: bool = True,
    browser: str | None = None,
    timeout: float = 45.0,
    attempts: int = 3,
) -> Path:
    """Open a saved preview in headless Chromium and save a PNG of it.

    Chromium renders WebGL in software here (``--disable-gpu``), so this works
    on machines without a display or GPU.

    Args:
        page: the preview HTML file.
        png: the PNG to write.
        t: open the preview paused at this time in seconds (``?t=``); ``None``
            lets it play from the start.
        size: window ``(width, height)`` in pixels; the PNG has this size.
        wait_ms: virtual time the page is given before the shot, milliseconds.
        offline: block every network request (DNS and proxy), which proves
            the page needs none.
        quiet: hide viser's pop-up notices (``?quiet``), such as its warning
            that WebGL runs in software.
        browser: browser executable (default: :func:`find_chromium`).
        timeout: seconds before a hung browser is killed.
        attempts: tries before giving up (now and then, on a loaded machine,
            headless Chromium never finishes its virtual time budget).

    Returns:
        The PNG path.

    Raises:
        BrowserNotFoundError: no browser; RuntimeError: no screenshot written.
    """
    exe = browser or find_chromium()
    page = Path(page).resolve()
    if not page.is_file():
        raise FileNotFoundError(page)
    png = Path(png).resolve()
    png.parent.mkdir(parents=True, exist_ok=True)
    if png.exists():
        png.unlink()
    query = [] if t is None else [f"t={float(t):g}"]
    if quiet:
        query.append("quiet")
    url = page.as_uri() + ("?" + "&".join(query) if query else "")
    last = ""
    for _ in range(max(1, attempts)):
        with tempfile.TemporaryDirectory(prefix="backdrive-chromium-") as profile:
            args = [
                exe,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                # Software WebGL on purpose (the page is our own file): without
                # this, Chromium's deprecated automatic fallback is used.
                "--enable-unsafe-swiftshader",
                "--use-angle=swiftshader",
                "--disable-background-networking",
                "--disable-component-update",
                "--no-first-run",
                "--disable-sync",
                "--hide-scrollbars",
                "--mute-audio",
                f"--user-data-dir={profile}",
                f"--window-size={int(size[0])},{int(size[1])}",
                f"--virtual-time-budget={int(wait_ms)}",
                f"--screenshot={png}",
            ]
            if offline:
                args += ["--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=http://127.0.0.1:9"]
            # Own session, so that a hung browser is killed with all its helper processes.
            proc = subprocess.Popen(
                args + [url], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
            )
            try:
                _, err = proc.communicate(timeout=timeout)
                last = f"exit {proc.returncode}: " + err.decode(errors="replace")[-2000:]
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                last = f"no answer in {timeout:g} s"
                continue
        if png.is_file() and png.stat().st_size > 0:
            return png
    raise RuntimeError(f"{exe} wrote no screenshot of {url} ({last})")
