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


def stage_mass_spring_damper(ctx: DemoContext) -> list[str]:
    """Trajectory optimisation through the simulator: plain Adam beside L-BFGS and Gauss-Newton."""
    from ..optim import demo_mass_spring_damper
    from ..viz import plot_losses

    demo = demo_mass_spring_damper(progress=True)
    print(demo.summary())
    png = ctx.wrote(
        plot_losses(
            {
                "Adam (lr 0.1)": demo.adam.losses,
                "L-BFGS": demo.lbfgs.losses,
                "Gauss-Newton": demo.gauss_newton.losses,
            },
            ctx.path("mass_spring_damper_losses.png"),
            title="mass-spring-damper: loss per iteration",
        )
    )
    return [
        "## Mass-spring-damper trajectory optimisation",
        "50 force inputs, loss = sum of squared positions (mass 1, spring 15, damping 0.5, dt 0.01).",
        "",
        "| optimiser | iterations | final loss | wall time |",
        "| --- | --- | --- | --- |",
        *(
            f"| {name} | {r.iterations} | {r.loss:.4g} | {r.wall_time:.2f} s |"
            for name, r in (("Adam lr 0.1", demo.adam), ("L-BFGS", demo.lbfgs), ("Gauss-Newton", demo.gauss_newton))
        ),
        f"- plot: `{png.name}`",
    ]


def stage_panda_ik(ctx: DemoContext) -> list[str]:
    """Differentiable IK on the Panda: batched multi-start solves to random reachable targets."""
    from ..data import get_data_path
    from ..kinematics import DifferentiableIKCfg, SerialChainKinematics
    from ..layers import DifferentiableFKLayer, DifferentiableIKLayer
    from ..viz import plot_ik_errors, preview

    chain = SerialChainKinematics.from_urdf(
        get_data_path("panda"), end_link_name="panda_hand_tcp", dtype=torch.float64
    )
    fk = DifferentiableFKLayer(chain)
    n = 200 if ctx.quick else 1000
    g = torch.Generator().manual_seed(0)
    q_true = fk.lower + (fk.upper - fk.lower) * torch.rand(n, fk.dof, generator=g, dtype=torch.float64)
    targets = fk(q_true)
    rows = []
    results = {}
    for label, cfg in (
        ("single seed, 16 iterations", DifferentiableIKCfg()),
        ("8 seeds, 32 iterations", DifferentiableIKCfg(max_iterations=32, num_seeds=8)),
    ):
        ik = DifferentiableIKLayer(fk, cfg)
        t0 = time.perf_counter()
        res = ik.solve(targets)
        dt = time.perf_counter() - t0
        rate = float(res.success.double().mean())
        results[label] = res
        rows.append(f"| {label} | {rate * 100:.1f}% | {dt:.2f} s |")
        print(f"IK {label}: success {rate * 100:.1f}% of {n} targets in {dt:.2f} s")
    best = results["8 seeds, 32 iterations"]
    png = ctx.wrote(
        plot_ik_errors(
            best.position_error.norm(dim=-1).detach(),
            best.rotation_error.norm(dim=-1).detach(),
            ctx.path("panda_ik_errors.png"),
        )
    )
    # Preview: the arm visiting the first few solutions, interpolated in joint space.
    panda_model = chain.model
    k = 6
    sols = best.qpos[:k].detach()
    fingers = torch.full((k, panda_model.nq - fk.dof), 0.02, dtype=torch.float64)
    keys = torch.cat([sols, fingers], dim=-1)
    w = torch.linspace(0, 1, 30, dtype=torch.float64)[:, None, None]
    frames = (keys[:-1][None] * (1 - w) + keys[1:][None] * w).transpose(0, 1).reshape(-1, panda_model.nq)
    html = ctx.wrote(
        preview(
            panda_model,
            frames,
            targets=targets[:k, :3, 3].detach(),
            paths="panda_hand_tcp",
            path=ctx.path("panda_ik.html"),
            title="Panda: IK solutions to the red targets",
        )
    )
    return [
        "## Panda differentiable IK",
        f"{n} reachable targets (joints uniform within limits, then FK); success = 0.5 mm and 0.5 mrad.",
        "",
        "| solver | success | wall time |",
        "| --- | --- | --- |",
        *rows,
        f"- error histogram: `{png.name}`; preview: `{html.name}`",
    ]


def stage_cartpole_swingup(ctx: DemoContext) -> list[str]:
    """Cart-pole swing-up from hanging to upright by trajectory optimisation."""
    from ..optim import cartpole_swingup
    from ..viz import plot_joint_trajectories, plot_losses, preview

    run = cartpole_swingup(quick=ctx.quick, progress=True)
    print(run.summary())
    traj = run.result.trajectory
    q = traj.q.detach()
    dt = run.simulator.dt
    t = torch.arange(q.shape[0], dtype=q.dtype) * dt
    robot = run.simulator.robot
    png = ctx.wrote(plot_joint_trajectories(t, q, robot.joint_names, ctx.path("cartpole_joints.png")))
    loss_png = ctx.wrote(plot_losses({"swing-up": run.result.losses}, ctx.path("cartpole_losses.png")))
    html = ctx.wrote(
        preview(robot, q, path=ctx.path("cartpole_swingup.html"), fps=1.0 / dt, title="cart-pole swing-up")
    )
    return [
        "## Cart-pole swing-up",
        f"- {run.summary()}",
        f"- upright at the end: {'yes' if run.success else 'no'}",
        f"- plots: `{png.name}`, `{loss_png.name}`; preview: `{html.name}`",
    ]


STAGES: list[tuple[str, Callable[[DemoContext], list[str]]]] = [
    ("Panda model and forward kinematics", stage_panda_model),
    ("Mass-spring-damper trajectory optimisation", stage_mass_spring_damper),
    ("Panda differentiable inverse kinematics", stage_panda_ik),
    ("Cart-pole swing-up by trajectory optimisation", stage_cartpole_swingup),
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
