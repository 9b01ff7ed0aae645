"""Screenshots of saved previews in headless Chromium (for tests, docs and thumbnails).

The browser is driven over the DevTools protocol (a websocket on 127.0.0.1):
load the page, wait until viser's client has drawn it, scrub with the page's
``window.backdriveSeek``, wait for the new frame, capture. Waiting on the page
itself rather than on Chromium's virtual-time budget matters: with software
WebGL on a loaded machine, ``--virtual-time-budget`` runs now and then never
returned.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from .._errors import BrowserNotFoundError
from ._deps import require

__all__ = ["find_chromium", "screenshot", "screenshots", "BrowserNotFoundError"]

_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")

# Resolves after `n` animation frames: the frame after a scene change is drawn.
_FRAMES = "new Promise(r => { let n = 0; const f = () => (++n >= %d ? r(n) : requestAnimationFrame(f)); requestAnimationFrame(f); })"


def find_chromium() -> str:
    """Path of a Chromium-family browser: ``$BACKDRIVE_CHROMIUM``, else the first on ``PATH``.

    Raises:
        BrowserNotFoundError: naming the Debian package to install.
    """
    env = os.environ.get("BACKDRIVE_CHROMIUM")
    if env:
        found = shutil.which(env)
        if found is None:
            raise BrowserNotFoundError(f"BACKDRIVE_CHROMIUM={env!r} is not an executable")
        return found
    for name in _CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    raise BrowserNotFoundError(
        "no Chromium found (tried " + ", ".join(_CANDIDATES) + "); on Debian: "
        "apt-get update && apt-get install -y chromium, or set BACKDRIVE_CHROMIUM"
    )


class _Browser:
    """One headless Chromium process and a DevTools session on its first tab."""

    def __init__(self, exe: str, size: tuple[int, int], *, offline: bool, timeout: float):
        self.timeout = timeout
        self.size = (int(size[0]), int(size[1]))
        self._profile = tempfile.TemporaryDirectory(prefix="backdrive-chromium-")
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
            f"--user-data-dir={self._profile.name}",
            f"--window-size={self.size[0]},{self.size[1]}",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
        ]
        if offline:
            # DNS fails and every proxied request goes nowhere: the page must need no network.
            args += ["--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=http://127.0.0.1:9"]
        # Own session, so that the browser is killed with all its helper processes.
        self.proc = subprocess.Popen(
            args + ["about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        self._log: deque[str] = deque(maxlen=40)
        self._endpoint: str | None = None
        self._found = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()
        self.ws = None
        self._id = 0
        try:
            self._connect()
        except BaseException:
            self.close()
            raise

    def _drain(self) -> None:
        # Keep reading stderr so the browser never blocks on a full pipe.
        for raw in self.proc.stderr:  # type: ignore[union-attr]
            line = raw.decode(errors="replace").rstrip()
            self._log.append(line)
            m = re.search(r"DevTools listening on (ws://\S+)", line)
            if m:
                self._endpoint = m.group(1)
                self._found.set()
        self._found.set()

    def log_tail(self) -> str:
        return "\n".join(self._log)

    def _connect(self) -> None:
        connect = require("websockets.sync.client", "backdrive.viz.screenshot").connect
        if not self._found.wait(self.timeout) or self._endpoint is None:
            raise TimeoutError(f"Chromium did not open its DevTools port:\n{self.log_tail()}")
        port = re.match(r"ws://[^:/]+:(\d+)/", self._endpoint).group(1)  # type: ignore[union-attr]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=self.timeout) as r:
            pages = [t for t in json.load(r) if t.get("type") == "page"]
        if not pages:
            raise RuntimeError("Chromium has no page to drive")
        self.ws = connect(pages[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=self.timeout)
        w, h = self.size
        self.call("Emulation.setDeviceMetricsOverride", width=w, height=h, deviceScaleFactor=1, mobile=False)

    def call(self, method: str, **params):
        self._id += 1
        mine = self._id
        self.ws.send(json.dumps({"id": mine, "method": method, "params": params}))  # type: ignore[union-attr]
        deadline = time.monotonic() + self.timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer to {method} in {self.timeout:g} s")
            msg = json.loads(self.ws.recv(timeout=left))  # type: ignore[union-attr]
            if msg.get("id") == mine:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def evaluate(self, expression: str, *, wait: bool = False):
        result = self.call("Runtime.evaluate", expression=expression, awaitPromise=wait, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails'].get('text')}")
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, what: str):
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.1)
        raise TimeoutError(f"timed out after {self.timeout:g} s waiting for {what}")

    def settle(self, frames: int, seconds: float) -> None:
        self.evaluate(_FRAMES % frames, wait=True)
        time.sleep(seconds)
        self.evaluate(_FRAMES % 1, wait=True)

    def capture(self, png: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        png.write_bytes(base64.b64decode(data))
        return png

    def close(self) -> None:
        if self.ws is not None:
            try:
                self.ws.close()
            except OSError:
                pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        self._profile.cleanup()


def screenshots(
    page,
    shots: Sequence[tuple[float | None, str | os.PathLike]],
    *,
    size: tuple[int, int] = (960, 720),
    settle_s: float = 0.5,
    offline: bool = True,
    quiet: bool = True,
    browser: str | None = None,
    timeout: float = 60.0,
    attempts: int = 2,
) -> list[Path]:
    """Load a saved preview once in headless Chromium and capture it at several times.

    Each shot scrubs the page's timeline to ``t`` seconds (pausing it) with
    ``window.backdriveSeek``, which types the time into viser's time box as a
    user would; ``t=None`` captures whatever is showing. Chromium renders
    WebGL in software, so no display or GPU is needed.

    Args:
        page: the preview HTML file.
        shots: ``(t, png_path)`` pairs, captured in order.
        size: viewport ``(width, height)``; every PNG has exactly this size.
        settle_s: seconds to let the scene draw after each seek (on top of
            three animation frames).
        offline: block every network request (DNS and proxy), which proves
            the page needs none.
        quiet: hide viser's pop-up notices (``?quiet``), such as its warning
            that WebGL runs in software.
        browser: browser executable (default: :func:`find_chromium`).
        timeout: seconds allowed for each step (start, load, seek).
        attempts: tries with a fresh browser before giving up.

    Returns:
        The PNG paths.

    Raises:
        BrowserNotFoundError: no browser; RuntimeError: every attempt failed.
    """
    exe = browser or find_chromium()
    page = Path(page).resolve()
    if not page.is_file():
        raise FileNotFoundError(page)
    outs = [Path(p).resolve() for _, p in shots]
    for p in outs:
        p.parent.mkdir(parents=True, exist_ok=True)
    url = page.as_uri() + ("?quiet" if quiet else "")
    failure = ""
    for _ in range(max(1, attempts)):
        b = None
        try:
            b = _Browser(exe, size, offline=offline, timeout=timeout)
            b.call("Page.enable")
            b.call("Page.navigate", url=url)
            b.wait_for("document.readyState === 'complete' && !!document.querySelector('canvas[data-engine]')",
                       "viser's 3-D canvas")
            b.wait_for("typeof window.backdriveSeek === 'function' && "
                       "!!document.querySelector('.mantine-NumberInput-input')", "the recording to load")
            for (t, _), png in zip(shots, outs):
                if t is not None:
                    before = int(b.evaluate("+(document.body.getAttribute('data-backdrive-seeks') || 0)"))
                    b.evaluate(f"window.backdriveSeek({float(t)!r})")
                    b.wait_for(f"+(document.body.getAttribute('data-backdrive-seeks') || 0) > {before}",
                               f"the seek to t = {t}")
                b.settle(3, settle_s)
                b.capture(png)
            return outs
        except (TimeoutError, RuntimeError, OSError) as exc:
            failure = f"{type(exc).__name__}: {exc}\n{b.log_tail() if b else ''}"
        finally:
            if b is not None:
                b.close()
    raise RuntimeError(f"{exe} could not capture {page}: {failure}")


def screenshot(page, png, *, t: float | None = None, size: tuple[int, int] = (960, 720), **kwargs) -> Path:
    """Open a saved preview in headless Chromium and save one PNG of it.

    Args:
        page: the preview HTML file.
        png: the PNG to write.
        t: scrub to this time in seconds first (``None``: as it plays).
        size: viewport ``(width, height)``; the PNG has exactly this size.
        **kwargs: as for :func:`screenshots`.
    """
    return screenshots(page, [(t, png)], size=size, **kwargs)[0]
