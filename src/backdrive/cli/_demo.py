"""``backdrive demo``: the main job, one small function per stage.

Each stage takes a :class:`DemoContext`, prints what it does, writes its files
under ``ctx.out`` and returns lines for ``summary.md``. Adding a stage means
writing one function and listing it in :data:`STAGES`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch


@dataclass
class DemoContext:
    out: Path
    quick: bool
    files: list[Path] = field(default_factory=list)

    def path(self, name: str) -> Path:
        p = self.out / name
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def wrote(self, p: Path | str) -> Path:
        p = Path(p)
        self.files.append(p)
        return p


def stage_panda_model(ctx: DemoContext) -> list[str]:
    """Load the shipped Panda, print its tree, run batched forward kinematics."""
    from ..data import load
    from ..kinematics import forward_kinematics

    panda = load("panda")
    print(panda.describe())
    q = panda.random_q(1000, generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    T = forward_kinematics(panda, q)
    dt = time.perf_counter() - t0
    tcp = T[:, panda.frame_index("panda_hand_tcp"), :3, 3]
    reach = tcp.norm(dim=-1)
    print(
        f"forward kinematics of {panda.num_frames} frames at 1000 random configurations: "
        f"{dt * 1e3:.1f} ms; TCP distance from the base {float(reach.min()):.3f}..{float(reach.max()):.3f} m"
    )
    return [
        "## Panda model",
        f"- {panda.num_bodies} bodies, {panda.num_frames} frames, nq = {panda.nq}, "
        f"total mass {float(panda.total_mass):.3f} kg",
        f"- forward kinematics, 1000 configurations x {panda.num_frames} frames: {dt * 1e3:.1f} ms",
        f"- TCP distance from the base: {float(reach.min()):.3f} to {float(reach.max()):.3f} m",
    ]


STAGES: list[tuple[str, Callable[[DemoContext], list[str]]]] = [
    ("Panda model and forward kinematics", stage_panda_model),
]


def run_demo(out: Path, quick: bool = False) -> int:
    """Run every stage, write ``summary.md`` and say where to look."""
    ctx = DemoContext(out=Path(out), quick=quick)
    ctx.out.mkdir(parents=True, exist_ok=True)
    summary = ["# backdrive demo", "", f"Mode: {'quick' if quick else 'full'}.", ""]
    start = time.perf_counter()
    for i, (title, stage) in enumerate(STAGES, 1):
        print(f"\n=== [{i}/{len(STAGES)}] {title} ===")
        t0 = time.perf_counter()
        lines = stage(ctx)
        summary += lines + [f"- stage time: {time.perf_counter() - t0:.1f} s", ""]
    total = time.perf_counter() - start
    summary += [f"Total time: {total:.1f} s.", ""]
    if ctx.files:
        summary += ["## Files", ""] + [f"- `{p.relative_to(ctx.out)}`" for p in ctx.files] + [""]
    summary_path = ctx.wrote(ctx.path("summary.md"))
    summary_path.write_text("\n".join(summary))
    print(f"\nDone in {total:.1f} s. Results in {ctx.out}/ (summary: {summary_path}).")
    previews = [p for p in ctx.files if p.suffix == ".html"]
    if previews:
        print("Open the previews in a browser, e.g.:")
        for p in previews:
            print(f"  file://{p.resolve()}")
    return 0
