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
    robot: str = "quadruped"  # the walking stage's robot: a key of QuadrupedWalk.SHIPPED_POLICIES
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


def _panda_tcp_layer():
    from ..data import get_data_path
    from ..kinematics import SerialChainKinematics
    from ..layers import DifferentiableFKLayer

    chain = SerialChainKinematics.from_urdf(
        get_data_path("panda"), end_link_name="panda_hand_tcp", dtype=torch.float64
    )
    return DifferentiableFKLayer(chain)


def _reachable_targets(fk, n: int, seed: int, center=None, spread: float | None = None) -> torch.Tensor:
    """TCP poses of joints drawn uniformly within the limits (or within
    ``center +- spread``, clamped into the limits)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, fk.dof, generator=g, dtype=fk.lower.dtype)
    if center is None:
        q = fk.lower + (fk.upper - fk.lower) * u
    else:
        q = torch.clamp(center + spread * (2 * u - 1), fk.lower, fk.upper)
    return fk(q)


def stage_panda_ik(ctx: DemoContext) -> list[str]:
    """Differentiable IK on the Panda: batched single- and multi-start solves to reachable targets."""
    from ..kinematics import DifferentiableIKCfg
    from ..layers import DifferentiableIKLayer
    from ..viz import plot_ik_errors, preview

    fk = _panda_tcp_layer()
    n = 200 if ctx.quick else 1000
    targets = _reachable_targets(fk, n, seed=0)
    rows = []
    results = {}
    for label, cfg in (
        ("single seed, 16 iterations", DifferentiableIKCfg()),
        ("32 seeds, 24 iterations", DifferentiableIKCfg(max_iterations=24, num_seeds=32)),
    ):
        ik = DifferentiableIKLayer(fk, cfg)
        t0 = time.perf_counter()
        res = ik.solve(targets)
        dt = time.perf_counter() - t0
        rate = float(res.success.double().mean())
        results[label] = res
        rows.append(f"| {label} | {rate * 100:.1f}% | {dt:.2f} s |")
        print(f"IK {label}: success {rate * 100:.1f}% of {n} targets in {dt:.2f} s")
    best = results["32 seeds, 24 iterations"]
    png = ctx.wrote(
        plot_ik_errors(
            best.position_error.norm(dim=-1).detach(),
            best.rotation_error.norm(dim=-1).detach(),
            ctx.path("panda_ik_errors.png"),
        )
    )
    # Preview: the arm visiting the first few solutions, interpolated in joint space.
    panda = fk.chain.model
    k = 6
    sols = best.qpos[:k].detach()
    fingers = torch.full((k, panda.nq - fk.dof), 0.02, dtype=torch.float64)
    keys = torch.cat([sols, fingers], dim=-1)
    w = torch.linspace(0, 1, 30, dtype=torch.float64)[:, None, None]
    frames = (keys[:-1][None] * (1 - w) + keys[1:][None] * w).transpose(0, 1).reshape(-1, panda.nq)
    html = ctx.wrote(
        preview(
            panda,
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


# Panda's "ready" posture (Franka's documented default), the centre of the learned-seed workspace.
PANDA_READY = (0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785)
IK_ITERS_FROM_SEED = 10


def stage_learned_ik_seed(ctx: DemoContext) -> list[str]:
    """A small network trained through the FK layer to predict joints from a pose
    (no joint labels: the loss is the TCP pose error), then used as the seed of
    the unrolled IK layer."""
    from torch import nn

    from ..kinematics import DifferentiableIKCfg
    from ..layers import DifferentiableIKLayer
    from ..spatial import pose_error
    from ..viz import plot_losses

    torch.manual_seed(0)
    fk = _panda_tcp_layer()
    ready, spread = torch.tensor(PANDA_READY, dtype=torch.float64), 0.6
    lo = torch.maximum(ready - 1.5 * spread, fk.lower)
    hi = torch.minimum(ready + 1.5 * spread, fk.upper)

    def features(T):
        return torch.cat([T[..., :3, 3], T[..., :3, :2].flatten(-2)], dim=-1)

    train0 = features(_reachable_targets(fk, 4096, seed=2, center=ready, spread=spread))
    mu, sigma = train0.mean(0), train0.std(0).clamp_min(1e-3)
    net = nn.Sequential(nn.Linear(9, 256), nn.SiLU(), nn.Linear(256, 256), nn.SiLU(), nn.Linear(256, fk.dof))
    net = net.to(torch.float64)
    nn.init.zeros_(net[-1].weight)
    nn.init.zeros_(net[-1].bias)

    def predict(T):
        return lo + (hi - lo) * torch.sigmoid(net((features(T) - mu) / sigma))

    def tcp_error(T):
        return pose_error(fk(predict(T)), T)[0].norm(dim=-1)

    steps = 600 if ctx.quick else 3000
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    held_out = _reachable_targets(fk, 500, seed=1, center=ready, spread=spread)
    losses = []
    with torch.no_grad():
        before = float(tcp_error(held_out).median())
    t0 = time.perf_counter()
    for step in range(steps):
        T = _reachable_targets(fk, 256, seed=100 + step, center=ready, spread=spread)
        dp, dr = pose_error(fk(predict(T)), T)
        loss = (dp.square().sum(-1) / 0.01**2 + dr.square().sum(-1) / 0.1**2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    train_time = time.perf_counter() - t0
    with torch.no_grad():
        after = float(tcp_error(held_out).median())
        # Few iterations show what a good seed buys.
        ik = DifferentiableIKLayer(fk, DifferentiableIKCfg(max_iterations=IK_ITERS_FROM_SEED))
        plain = float(ik.solve(held_out).success.double().mean())
        seeded = float(ik.solve(held_out, predict(held_out)).success.double().mean())
    print(
        f"joint predictor trained through FK for {steps} steps ({train_time:.1f} s): held-out median "
        f"TCP error {before * 1e3:.0f} mm -> {after * 1e3:.1f} mm; IK success ({IK_ITERS_FROM_SEED} iterations) "
        f"{plain * 100:.1f}% from the default seed, {seeded * 100:.1f}% from the learned seed"
    )
    png = ctx.wrote(
        plot_losses({"pose loss": losses}, ctx.path("learned_ik_seed_loss.png"), title="joint predictor: pose loss")
    )
    return [
        "## A learned IK seed, trained through the FK layer",
        f"Targets: TCP poses of joints within {spread} rad of the ready posture; no joint labels.",
        f"- {steps} Adam steps of 256 targets ({train_time:.1f} s): held-out median TCP error "
        f"{before * 1e3:.0f} mm before, {after * 1e3:.1f} mm after",
        f"- IK success on 500 held-out targets, {IK_ITERS_FROM_SEED} iterations: {plain * 100:.1f}% from the default seed, "
        f"{seeded * 100:.1f}% from the learned seed",
        f"- plot: `{png.name}`",
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


def stage_pendulum_policy(ctx: DemoContext) -> list[str]:
    """A neural-network policy learned by backpropagating through the simulator (SHAC)."""
    import math

    from ..data import load
    from ..envs import Pendulum
    from ..optim import PENDULUM_SHAC, evaluate_policy, train_policy
    from ..viz import plot_losses, preview

    eval_env = Pendulum(16, autoreset=False)  # gymnasium Pendulum-v1's start distribution
    trainer = train_policy(
        PENDULUM_SHAC.make_env(),
        preset=PENDULUM_SHAC,
        seed=0,
        eval_fn=lambda p: evaluate_policy(p, eval_env, seed=123),
        eval_every=5,
        progress=True,
    )
    final = evaluate_policy(trainer.policy, eval_env, seed=123)
    # Rows of updates that were not evaluated carry NaN.
    curve = [r["eval_return"] for r in trainer.history if not math.isnan(r.get("eval_return", math.nan))]
    print(
        f"SHAC: {trainer.updates_done} updates, {trainer.env_steps:,} environment steps, "
        f"{trainer.wall_s:.1f} s; mean return over 16 Pendulum-v1 episodes: {final:.1f} (solved: >= -200)"
    )
    png = ctx.wrote(
        plot_losses(
            {"evaluation return (negated)": [-r for r in curve]},
            ctx.path("pendulum_policy_curve.png"),
            title="pendulum policy (SHAC): negated return every 5 updates",
            xlabel="evaluation",
        )
    )
    # One swing-up from hanging at rest, drawn with the shipped pendulum
    # (its q = 0 hangs down; the environment's angle 0 is upright).
    env = Pendulum(1, autoreset=False)
    env.reset(seed=0)
    env.set_state(torch.tensor([[math.pi, 0.0]]))
    angles = [float(env.state[0, 0])]
    with torch.no_grad():
        obs = env.observation()
        for _ in range(env.max_episode_steps):
            obs, *_ = env.step(trainer.policy(obs))
            angles.append(float(env.state[0, 0]))
    q = torch.tensor(angles, dtype=torch.float64)[:, None] + math.pi
    html = ctx.wrote(
        preview(load("pendulum"), q, path=ctx.path("pendulum_policy.html"), fps=20, title="learned pendulum swing-up")
    )
    return [
        "## Pendulum policy learned through the simulator (SHAC)",
        f"- {trainer.updates_done} updates, {trainer.env_steps:,} environment steps, {trainer.wall_s:.1f} s",
        f"- mean return over 16 Pendulum-v1 episodes: {final:.1f} (solved: >= -200)",
        f"- plot: `{png.name}`; preview: `{html.name}`",
    ]


# The quadruped stage: PD gains and stance of the contact tests
# (tests/test_contact_robots.py), a 5 cm drop and a sideways kick of the base.
QUADRUPED_STANCE = (0.0, 0.7, -1.4)
QUADRUPED_KP, QUADRUPED_KD = 200.0, 6.0
QUADRUPED_DROP = 0.05
QUADRUPED_KICK = 0.8


def _concat_contact(a, b):
    """Two unbatched ContactResults (time first) joined along time."""
    import dataclasses

    from ..contact import ContactResult

    fields = {f.name: torch.cat([getattr(a, f.name), getattr(b, f.name)], 0)
              for f in dataclasses.fields(ContactResult) if f.name != "_bodies"}
    return ContactResult(**fields, _bodies=())


def stage_quadruped_push(ctx: DemoContext) -> list[str]:
    """The shipped quadruped dropped onto the ground stands under PD, is kicked sideways and recovers or falls."""
    import math

    from ..contact import ContactGeometry, ContactModel, ContactParameters
    from ..data import load
    from ..kinematics import forward_kinematics
    from ..sim import PDActuator, Simulator, State, Trajectory
    from ..viz import plot_contact_forces, preview

    robot = load("quadruped", floating_base=True)
    feet = [n for n in robot.link_names if n.endswith("_foot")]
    contact = ContactModel(robot, ContactGeometry.from_model(robot, links=feet), params=ContactParameters())
    # The implicit contact step is stable at 10 ms (docs/contact.md); --quick uses it.
    dt = 1e-2 if ctx.quick else 4e-3
    settle_s, recover_s = (0.4, 0.6) if ctx.quick else (0.8, 1.6)
    sim = Simulator(robot, dt, actuator=PDActuator(kp=QUADRUPED_KP, kd=QUADRUPED_KD), contact=contact)
    stance = torch.tensor(QUADRUPED_STANCE * 4, dtype=robot.dtype)
    q0 = robot.neutral()
    q0[7:] = stance
    T = forward_kinematics(robot, q0)
    foot_radius = float(contact.geometry.point_radius.max())
    q0[2] = -min(float(T[robot.frame_index(f), 2, 3]) for f in feet) + foot_radius + QUADRUPED_DROP
    n1, n2 = round(settle_s / dt), round(recover_s / dt)
    weight = float(robot.total_mass) * 9.81
    t0 = time.perf_counter()
    with torch.no_grad():
        a = sim.rollout(sim.initial_state(q0), stance.expand(n1, robot.num_joints))
        v = a.v[-1].clone()
        v[1] += QUADRUPED_KICK  # base-frame y: sideways while upright
        b = sim.rollout(State(a.q[-1], v), stance.expand(n2, robot.num_joints))
    sim_s = time.perf_counter() - t0
    traj = Trajectory(
        q=torch.cat([a.q, b.q[1:]]), v=torch.cat([a.v[:-1], b.v]), effort=torch.cat([a.effort, b.effort]),
        controls=torch.cat([a.controls, b.controls]), dt=dt, contact=_concat_contact(a.contact, b.contact),
    )
    tail = max(1, n1 // 5)
    settled_h = float(a.q[-tail:, 2].mean())
    settled_grf = float(a.contact.normal_force[-tail:].sum(-1).mean())
    peak = float(b.contact.normal_force.sum(-1).max())
    qf = b.q[-1]
    # Tilt: angle between the base z axis and the world's, from the quaternion (wxyz).
    w, x, y = (float(c) for c in qf[3:6])
    tilt = math.degrees(math.acos(max(-1.0, min(1.0, 1.0 - 2.0 * (x * x + y * y)))))
    final_h = float(qf[2])
    final_grf = float(b.contact.normal_force[-1].sum())
    recovered = tilt < 15.0 and abs(final_h - settled_h) < 0.03
    outcome = "recovered" if recovered else "fell"
    drift = float((qf[:2] - a.q[-1, :2]).norm())
    print(
        f"{n1 + n2} steps of {dt * 1e3:g} ms ({sim_s:.1f} s): settled base height {settled_h:.3f} m, "
        f"ground reaction {settled_grf:.1f} N = {settled_grf / weight:.3f} x weight ({weight:.1f} N)"
    )
    print(
        f"kick {QUADRUPED_KICK} m/s sideways at {n1 * dt:.2f} s: peak ground reaction {peak / weight:.2f} x weight; "
        f"{outcome}: tilt {tilt:.1f} deg, base height {final_h:.3f} m, moved {drift * 100:.1f} cm, "
        f"ground reaction {final_grf / weight:.3f} x weight"
    )
    png = ctx.wrote(
        plot_contact_forces(
            traj, ctx.path("quadruped_grf.png"), groups=contact, weight=weight, events={"kick": n1 * dt},
            title=f"quadruped: drop, stand, sideways kick ({outcome})",
        )
    )
    html = ctx.wrote(
        preview(robot, traj, terrain=contact, path=ctx.path("quadruped_push.html"),
                title=f"quadruped: drop, stand under PD, kick ({outcome})")
    )
    return [
        "## Quadruped on the ground: drop, stand, push",
        f"Shipped quadruped (floating base, {float(robot.total_mass):.2f} kg), foot spheres on a ground plane, "
        f"PD kp {QUADRUPED_KP:g} kd {QUADRUPED_KD:g} holding its stance, {dt * 1e3:g} ms steps.",
        f"- dropped from {QUADRUPED_DROP * 100:g} cm: settled base height {settled_h:.3f} m, ground reaction "
        f"{settled_grf:.1f} N = {settled_grf / weight:.3f} x weight",
        f"- kicked {QUADRUPED_KICK} m/s sideways at {n1 * dt:.2f} s: peak ground reaction {peak / weight:.2f} x weight",
        f"- outcome after {n2 * dt:.2f} s: **{outcome}** (tilt {tilt:.1f} deg, base height {final_h:.3f} m, "
        f"ground reaction {final_grf / weight:.3f} x weight)",
        f"- simulation: {n1 + n2} steps in {sim_s:.1f} s",
        f"- plot: `{png.name}`; preview: `{html.name}`",
    ]


def stage_quadruped_walk(ctx: DemoContext) -> list[str]:
    """The shipped walking policy of ``ctx.robot`` (trained through the contact simulator) plays a forward command."""
    from ..envs import QuadrupedWalk

    seconds = 3.0 if ctx.quick else 10.0
    name = "Go1" if ctx.robot == "go1" else "quadruped"
    env, policy = QuadrupedWalk.pretrained(2 if ctx.quick else 4, robot=ctx.robot)
    preset = QuadrupedWalk.shipped_preset(ctx.robot)
    t0 = time.perf_counter()
    m = env.evaluate(policy, (0.5, 0.0, 0.0), seconds=seconds, seed=0, settle=1.0)
    sim_s = time.perf_counter() - t0
    print(
        f"{env.num_envs} x {name}, {seconds:g} s at a 0.5 m/s forward command ({sim_s:.1f} s): forward speed "
        f"{m['forward_speed']:.2f} m/s, walked {m['distance']:.2f} m, upright {m['upright'] * 100:.0f}%"
    )
    lines = [
        f"## Quadruped walking ({name}): a policy learnt through the contact simulator",
        f"The shipped policy (`QuadrupedWalk.pretrained(robot={ctx.robot!r})`, made by "
        f"`examples/quadruped_walk.py --preset {preset.name} --ship`) "
        "commanded to walk forward at 0.5 m/s.",
        f"- {env.num_envs} robots for {seconds:g} s: forward speed {m['forward_speed']:.2f} m/s, "
        f"walked {m['distance']:.2f} m, upright {m['upright'] * 100:.0f}%",
        f"- simulation: {int(round(seconds / env.dt)) * env.substeps} physics steps of "
        f"{env.physics_dt * 1e3:g} ms in {sim_s:.1f} s",
    ]
    if not ctx.quick:
        # The full demo also trains briefly from scratch and plots the curve.
        from ..optim import train_policy

        preset_name = preset.name.upper()
        updates = 30
        trainer = train_policy(preset.make_env(), preset=preset, updates=updates, num_threads=1)
        rewards = [row["window_reward"] for row in trainer.history]
        print(f"trained from scratch for {updates} updates ({trainer.env_steps:,} env steps, "
              f"{trainer.wall_s:.0f} s): mean reward per step {rewards[0]:.2f} -> {rewards[-1]:.2f}")
        try:
            from ..viz import plot_losses

            png = ctx.wrote(plot_losses({f"SHAC, {preset_name}": rewards}, ctx.path("quadruped_walk_training.png"),
                                        log=False, title=f"{name}: mean reward per step while training",
                                        xlabel="update (512 env steps each)"))
            lines.append(f"- trained from scratch for {updates} updates in {trainer.wall_s:.0f} s: mean reward per "
                         f"step {rewards[0]:.2f} -> {rewards[-1]:.2f} (the shipped run: {preset.updates} updates); plot: `{png.name}`")
        except ImportError as exc:  # pragma: no cover - the viz extra is optional
            lines.append(f"- (no plot: {exc})")
    try:
        from ..viz import preview

        html = ctx.wrote(
            preview(env.robot, m["q"][:, 0], path=ctx.path("quadruped_walk.html"), fps=1 / env.dt,
                    terrain=env.contact, title=f"{name} walking at a 0.5 m/s command (learnt policy)")
        )
        lines.append(f"- preview: `{html.name}`")
    except ImportError as exc:  # pragma: no cover - the viz extra is optional
        lines.append(f"- (no preview: {exc})")
    return lines


STAGES: list[tuple[str, Callable[[DemoContext], list[str]]]] = [
    ("Panda model and forward kinematics", stage_panda_model),
    ("Mass-spring-damper trajectory optimisation", stage_mass_spring_damper),
    ("Panda differentiable inverse kinematics", stage_panda_ik),
    ("A learned IK seed, trained through the FK layer", stage_learned_ik_seed),
    ("Cart-pole swing-up by trajectory optimisation", stage_cartpole_swingup),
    ("Pendulum policy learned through the simulator", stage_pendulum_policy),
    ("Quadruped on the ground: drop, stand, push", stage_quadruped_push),
    ("Quadruped walking with a policy learnt through contact", stage_quadruped_walk),
]


def run_demo(out: Path, quick: bool = False, robot: str = "quadruped") -> int:
    """Run every stage, write ``summary.md`` and say where to look.

    ``robot`` picks the walking stage's shipped policy: ``"quadruped"`` (the
    shipped robot) or ``"go1"`` (example-robot-data's Go1; needs the
    ``example-robot-data`` package, part of the ``[test]`` and ``[bench]`` extras).
    """
    ctx = DemoContext(out=Path(out), quick=quick, robot=robot)
    ctx.out.mkdir(parents=True, exist_ok=True)
    # The demo's problems are small: one intra-op thread avoids the spinning
    # and contention that made them several times slower on 2 shared cores.
    torch.set_num_threads(1)
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
