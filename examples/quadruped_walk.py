"""Teach the shipped quadruped to walk by backpropagating through backdrive's contact simulator (SHAC).

``backdrive.envs.QuadrupedWalk`` simulates the shipped 12-dof quadruped
(12.4 kg) with one contact sphere per foot on flat ground: 50 Hz PD joint
targets, 4 physics substeps of 5 ms with the implicit contact step. Every
step is differentiable, so SHAC back-propagates the return of short windows
(plus a learned critic's value of where they end) through the contact
forces into the policy. The settings are ``backdrive.optim.QUADRUPED_WALK_SHAC_DECAY``
(``QUADRUPED_WALK_SHAC`` with both learning rates decaying to 0 at the last
update; ``docs/locomotion.md`` says why each setting is there).

    python examples/quadruped_walk.py                  # the preset's run (420 updates, ~15 min)
    python examples/quadruped_walk.py --minutes 5      # stop after 5 min of training
    python examples/quadruped_walk.py --ship           # also write the shipped policy file
    python examples/quadruped_walk.py --preset quadruped_walk_shac_dr --out outputs/examples/dr
                                                       # the same recipe under domain randomisation
    python examples/quadruped_walk.py --preset go1_walk_shac_slip --ship
                                                       # Unitree Go1 (example-robot-data), 150 updates:
                                                       # writes .../policies/go1_walk.pt

The shipped policy is this run with the defaults (seed 0, 420 updates);
training on one thread is deterministic, so ``--ship`` reproduces it on the
machine that made it (and ``--preset go1_walk_shac_slip --ship`` Go1's,
``QuadrupedWalk.pretrained(robot="go1")``). Training is chaotic: another
CPU's kernels act like a new seed, so the file records where it was made
(``provenance``) and ``docs/locomotion.md`` gives the spread over seeds.
``--robot go1`` trains any of the presets on Go1; ``--compile`` steps the
training env through ``torch.compile`` (its compile time counts as training).

Prints the forward speed under a 0.5 m/s command over 10-second test episodes
and the fraction that stay upright. Writes to ``outputs/examples/``:
``quadruped_walk.png`` (learning curve, forward speed and base height of the
test episodes), the CSV log, the checkpoint, and a browser preview of the
gait (``quadruped_walk.html``, with the ``viz`` extra). ``--ship`` writes
the policy (weights, settings and env keywords only, read with
``weights_only=True``) to ``src/backdrive/data/policies/quadruped_walk.pt``,
the file ``backdrive demo`` plays (``go1_walk.pt`` for Go1).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from backdrive.envs import QuadrupedWalk
from backdrive.optim import QUADRUPED_WALK_SHAC_DECAY, load_policy, train_policy
from backdrive.optim._policy.presets import PRESETS
from backdrive.optim._policy.checkpoints import provenance, read_checkpoint, write_checkpoint

DATA = Path(__file__).resolve().parents[1] / "src" / "backdrive" / "data"
COMMAND = (0.5, 0.0, 0.0)
TEST_EPISODES, TEST_SEED = 16, 999


def slim_checkpoint(src: Path, dst: Path, env_kwargs: dict, metrics: dict, preset: str | None = None) -> None:
    """The policy part of a training checkpoint, with the env keywords, the measured gait, the
    name of the preset that trained it and where it was trained (source commit, torch, CPU kernels)."""
    ckpt = read_checkpoint(src)
    keep = {k: ckpt[k] for k in ("format", "config", "policy")}
    keep["env_kwargs"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in env_kwargs.items()
                          if k != "num_envs"}
    keep["metrics"] = {k: float(v) for k, v in metrics.items() if isinstance(v, float)}
    if preset is not None:
        keep["preset"] = preset
    keep["provenance"] = provenance(("src", "examples/quadruped_walk.py"))
    write_checkpoint(keep, dst)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default=QUADRUPED_WALK_SHAC_DECAY.name,
                        choices=[k for k, p in PRESETS.items() if p.env_type is QuadrupedWalk],
                        help="the training settings (evaluation always runs the nominal physics)")
    parser.add_argument("--updates", type=int, default=None, help="default: the preset's")
    parser.add_argument("--minutes", type=float, default=None,
                        help="also stop training after this wall time (the shipped policy: the preset's updates)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--robot", default=None, choices=["quadruped", "go1"],
                        help="train this robot instead of the preset's")
    parser.add_argument("--compile", action="store_true",
                        help="step the training env's physics through torch.compile (inductor)")
    parser.add_argument("--out", type=Path, default=Path("outputs/examples"))
    parser.add_argument("--ship", action="store_true",
                        help=f"write the shipped policy of the robot to {DATA / 'policies'} "
                        "(quadruped_walk.pt, go1_walk.pt)")
    args = parser.parse_args()
    preset = PRESETS[args.preset]
    if args.updates is None:
        args.updates = preset.updates
    robot = args.robot or preset.env_kwargs.get("robot") or "quadruped"
    shipped = DATA / QuadrupedWalk.SHIPPED_POLICIES[robot]
    args.out.mkdir(parents=True, exist_ok=True)

    torch.set_num_threads(1)
    log = args.out / "quadruped_walk.csv"
    log.unlink(missing_ok=True)
    ckpt = args.out / "quadruped_walk.pt"
    env_kwargs = dict(preset.env_kwargs)
    if args.robot is not None:
        env_kwargs["robot"] = args.robot
    # Evaluations and the test run the nominal physics (no randomisation), as for the nominal preset.
    test_kwargs = {k: v for k, v in env_kwargs.items() if k not in ("num_envs", "randomization")}
    eval_env = QuadrupedWalk(8, **test_kwargs)
    curve: list[tuple[int, float, float, float]] = []
    start = time.perf_counter()

    per_update = preset.env_steps // preset.updates

    eval_cpu = [0.0]

    def eval_fn(policy) -> float:
        # Called after an update and before its log row reaches the callback.
        c0 = time.process_time()
        steps = trainer_steps[0] + per_update
        m = eval_env.evaluate(policy, COMMAND, seconds=4.0, seed=123, settle=1.0)
        curve.append((steps, time.perf_counter() - start, m["forward_speed"], m["upright"]))
        print(f"  eval after {steps:,} steps: forward speed {m['forward_speed']:.3f} m/s, "
              f"upright {m['upright']:.2f}", flush=True)
        eval_cpu[0] += time.process_time() - c0
        return float(m["rewards"].sum(0).mean())

    trainer_steps = [0]

    def callback(row) -> bool:
        trainer_steps[0] = int(row["env_steps"])
        return args.minutes is not None and row["wall_s"] > 60.0 * args.minutes

    cpu0 = time.process_time()
    trainer = train_policy(
        preset.make_env(**env_kwargs, **({"compile": True} if args.compile else {})),
        preset=preset,
        updates=args.updates,
        seed=args.seed,
        eval_fn=eval_fn,
        eval_every=25,
        log_csv=log,
        checkpoint=ckpt,
        checkpoint_every=25,
        callback=callback,
        num_threads=1,
    )
    trainer.save(ckpt)  # under torchrun every rank calls it; rank 0 writes
    if not trainer.data_parallel.is_main:
        return  # under torchrun the test episodes, plots and files are rank 0's
    cpu = time.process_time() - cpu0
    print(f"trained: {trainer.updates_done} updates, {trainer.env_steps:,} env steps, "
          f"{trainer.wall_s / 60:.1f} min training wall time, {(cpu - eval_cpu[0]) / 60:.2f} min training CPU "
          f"({cpu / 60:.2f} min CPU with the evaluations during training)")

    policy = load_policy(ckpt)
    test = QuadrupedWalk(TEST_EPISODES, **test_kwargs)
    m = test.evaluate(policy, COMMAND, seconds=10.0, seed=TEST_SEED)
    print(f"{TEST_EPISODES} test episodes of 10 s at a {COMMAND[0]} m/s command: forward speed "
          f"{m['forward_speed']:.3f} m/s (mean |error| per episode {m['speed_error']:.3f} m/s), walked "
          f"{m['distance']:.2f} m, upright {m['upright'] * 100:.0f}%")
    if args.ship:
        shipped.parent.mkdir(parents=True, exist_ok=True)
        # The file's env keywords build the env the policy runs in (pretrained()): the nominal physics,
        # without the randomisation a preset may train under (its name records the training settings).
        slim_checkpoint(ckpt, shipped, test_kwargs, {**m, "env_steps": float(trainer.env_steps),
                                                     "train_minutes": trainer.wall_s / 60,
                                                     "train_cpu_minutes": (cpu - eval_cpu[0]) / 60}, preset.name)
        print(f"shipped policy: {shipped} ({shipped.stat().st_size / 1024:.0f} KiB)")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    q = m["q"]
    t = torch.arange(q.shape[0]) * test.dt
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    if curve:
        steps, _, speed, upright = zip(*curve)
        axes[0].plot(steps, speed, marker=".", label="forward speed, m/s")
        axes[0].plot(steps, upright, marker=".", label="upright fraction")
        axes[0].axhline(COMMAND[0], color="k", lw=0.8, ls="--", label="command")
        axes[0].legend()
    axes[0].set_xlabel("environment steps")
    axes[0].set_title("SHAC through contact: evaluation during training")
    heading = q[1:, :, :3] - q[:-1, :, :3]
    axes[1].plot(t[1:], (heading.norm(dim=-1) / test.dt)[:, :4].numpy(), lw=0.8)
    axes[1].axhline(COMMAND[0], color="k", lw=0.8, ls="--")
    axes[1].set_ylabel("base speed, m/s")
    axes[2].plot(t, q[:, :4, 2].numpy(), lw=0.8)
    axes[2].set_ylabel("base height, m")
    for ax in axes[1:]:
        ax.set_xlabel("time, s")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out / "quadruped_walk.png", dpi=80)
    print(f"plots: {args.out / 'quadruped_walk.png'}")

    try:
        from backdrive.viz import preview

        page = preview(test.robot, q[:, 0], path=args.out / "quadruped_walk.html", fps=1 / test.dt,
                       terrain=test.contact, title="Quadruped walking at a 0.5 m/s command, learnt with SHAC")
        print(f"preview: {page}")
    except ImportError as exc:  # the viz extra is optional
        print(f"(no browser preview: {exc})")


if __name__ == "__main__":
    main()
