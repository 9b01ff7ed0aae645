"""G1 balance under random pushes: SHAC through backdrive's contact simulator against zero action (PD only).

``backdrive.envs.HumanoidBalance`` as the preset builds it (default
``humanoid_capture_shac``: example-robot-data's G1, 50 Hz PD offsets on legs
and waist, 2 x 10 ms contact substeps, the base velocity and height observed,
the sole-outline feet and the capture-point balance prior under the policy).
Each seed trains ``train_policy(preset=...)`` until its training wall time
reaches the budget; every policy, the shipped one, zero action (the PD
servos alone, with the sole-outline feet and with the URDF's foot spheres),
zero action with the ankle-only prior (``G1_BALANCE_FEEDBACK``) and with the
capture-point prior (``G1_CAPTURE_FEEDBACK``) are then evaluated on the same
32 fresh 10-second episodes with pushes of up to 0.5 m/s (uniform direction
and magnitude; ``--push-velocity`` changes it) at random times, on average
every 4 s. Issue 12's target: the robot stays up in at least 90 % of
episodes.

    python benchmarks/humanoid_balance.py --seeds                  # baselines, priors and the shipped policy
    python benchmarks/humanoid_balance.py --minutes 5 --seeds 0    # plus a quick training run
    python benchmarks/humanoid_balance.py --seeds --push-velocity 0.7   # the margin: larger pushes
    python benchmarks/humanoid_balance.py --physics                # the physics-step comparison

Writes ``outputs/benchmarks/humanoid_balance.json`` and prints a markdown
table. Needs example-robot-data.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from backdrive.envs import HumanoidBalance
from backdrive.envs._humanoid import G1_BALANCE_FEEDBACK, G1_CAPTURE_FEEDBACK
from backdrive.optim import train_policy
from backdrive.optim._policy.presets import PRESETS

EVAL_EPISODES, EVAL_SEED, EVAL_SECONDS = 32, 999, 10.0
EVAL_PUSHES = {"push_velocity": 0.5, "push_interval": 4.0}
PRESET = PRESETS["humanoid_capture_shac"]


def eval_env(**overrides) -> HumanoidBalance:
    kwargs = {k: v for k, v in PRESET.env_kwargs.items() if k != "num_envs"}
    return HumanoidBalance(EVAL_EPISODES, **{**kwargs, **EVAL_PUSHES, **overrides})


def evaluate(policy, **overrides) -> dict:
    m = eval_env(**overrides).evaluate(policy, seconds=EVAL_SECONDS, seed=EVAL_SEED)
    return {k: m[k] for k in ("upright", "fell", "pushes", "pushes_survived", "base_speed", "height")} | {
        "return": float(m["rewards"].sum(0).mean())
    }


def run_shac(seed: int, minutes: float) -> dict:
    cpu0 = time.process_time()
    trainer = train_policy(
        PRESET.make_env(), preset=PRESET, updates=100_000, seed=seed, num_threads=1,
        callback=lambda row: row["wall_s"] > 60.0 * minutes,
    )
    cpu = time.process_time() - cpu0
    policy = trainer.policy.eval()
    with torch.no_grad():
        result = evaluate(policy)
    return {"method": "shac", "seed": seed, "env_steps": trainer.env_steps, "train_wall_s": trainer.wall_s,
            "train_cpu_s": cpu, **result}


def physics_check() -> list[dict]:
    """Standing, an uneven landing and pushed recoveries at 2, 5 and 10 ms physics steps, float64.

    Zero action from the same states: the standing pose dropped from 5 mm; a
    landing from 2 cm with 0.1 rad of joint noise; after 1 s of standing,
    pushes of 0.3 m/s forward, (-0.3, 0.2) m/s and 0.5 m/s sideways (world
    frame). Base position 1 s after the pushes (2 s after the start).
    """
    rows = []
    cases = {"stand": (0.0, 0.0), "push +0.3 x": (0.3, 0.0), "push (-0.3, 0.2)": (-0.3, 0.2),
             "push 0.5 y": (0.0, 0.5)}
    for physics_dt in (0.002, 0.005, 0.01):
        env = HumanoidBalance(len(cases) + 1, substeps=round(0.02 / physics_dt), push_velocity=0.0,
                              dtype=torch.float64, init_noise=0.0)
        env.reset(seed=0)
        s = env.state.clone()
        # the last copy: an uneven landing (joint noise, dropped from 2 cm)
        g = torch.Generator().manual_seed(1)
        s[-1, 7:36] += 0.1 * (2 * torch.rand(29, generator=g, dtype=torch.float64) - 1)
        s[-1, 2] += 0.015
        env.set_state(s)
        zero = torch.zeros(env.num_envs, 15, dtype=torch.float64)
        t0 = time.perf_counter()
        with torch.no_grad():
            for _ in range(50):
                env.step(zero)
            dv = torch.tensor([[*c, 0.0] for c in cases.values()] + [[0.0, 0.0, 0.0]], dtype=torch.float64)
            env.set_state(env.push(env.state, dv))
            for _ in range(50):
                env.step(zero)
        wall = time.perf_counter() - t0
        end = env.state[:, :3]
        for i, name in enumerate([*cases, "uneven landing"]):
            rows.append({"physics_dt": physics_dt, "case": name, "x": float(end[i, 0]),
                         "y": float(end[i, 1]), "z": float(end[i, 2]), "wall_s": wall})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=12.0, help="training wall time per seed")
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--physics", action="store_true", help="only the physics-step comparison")
    parser.add_argument("--preset", choices=("humanoid_capture_shac", "humanoid_balance_shac"),
                        default="humanoid_capture_shac", help="what the seeds train")
    parser.add_argument("--push-velocity", type=float, default=0.5, help="the evaluation's largest push, m/s")
    parser.add_argument("--out", type=Path, default=Path("outputs/benchmarks/humanoid_balance.json"))
    args = parser.parse_args()
    global PRESET
    PRESET = PRESETS[args.preset]
    EVAL_PUSHES["push_velocity"] = args.push_velocity
    torch.set_num_threads(1)
    args.out.parent.mkdir(parents=True, exist_ok=True)

    if args.physics:
        rows = physics_check()
        print("| physics step | case | base x at 2 s | base y | base z |")
        print("| ---: | --- | ---: | ---: | ---: |")
        for r in rows:
            print(f"| {r['physics_dt'] * 1e3:.0f} ms | {r['case']} | {r['x']:+.4f} m | {r['y']:+.4f} m | {r['z']:.4f} m |")
        args.out.with_name("humanoid_balance_physics.json").write_text(json.dumps(rows, indent=1))
        return

    rows = []
    zero = {"seed": "-", "env_steps": 0, "train_wall_s": 0.0, "train_cpu_s": 0.0}
    for method, kw in (
        ("zero action (PD only), the URDF's foot spheres", {"balance_feedback": None, "feet": "urdf"}),
        ("zero action (PD only)", {"balance_feedback": None, "feet": "sole"}),
        # The hand-designed priors (not learnt), zero action on top.
        ("zero action + ankle-only prior (G1_BALANCE_FEEDBACK)", {"balance_feedback": G1_BALANCE_FEEDBACK, "feet": "sole"}),
        ("zero action + capture-point prior (G1_CAPTURE_FEEDBACK)", {"balance_feedback": G1_CAPTURE_FEEDBACK, "feet": "sole"}),
    ):
        rows.append({"method": method, **zero, **evaluate(None, **kw)})
        print(rows[-1], flush=True)
    try:
        shipped_env, shipped = HumanoidBalance.pretrained(1)
        with torch.no_grad():
            rows.append({"method": "shipped policy", "seed": 0, "env_steps": math.nan, "train_wall_s": math.nan,
                         "train_cpu_s": math.nan, **evaluate(shipped)})
        print(rows[-1], flush=True)
    except FileNotFoundError:
        pass
    for seed in args.seeds:
        rows.append(run_shac(seed, args.minutes))
        print(rows[-1], flush=True)
    out = args.out if args.push_velocity == 0.5 else args.out.with_name(f"{args.out.stem}_push{args.push_velocity:g}.json")
    out.write_text(json.dumps(rows, indent=1))

    print(f"\n{EVAL_EPISODES} episodes of {EVAL_SECONDS:.0f} s, pushes up to {args.push_velocity} m/s every 4 s "
          "on average\n")
    print("| policy | seed | env steps | training wall / CPU | upright | pushes per episode | pushes survived "
          "| mean base speed | pelvis height |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        train = "-" if not r["train_wall_s"] or r["train_wall_s"] != r["train_wall_s"] else \
            f"{r['train_wall_s'] / 60:.1f} min / {r['train_cpu_s'] / 60:.1f} min"
        steps = f"{r['env_steps']:,}" if r["env_steps"] == r["env_steps"] and r["env_steps"] else "-"
        print(f"| {r['method']} | {r['seed']} | {steps} | {train} | {r['upright'] * 100:.0f} % "
              f"({EVAL_EPISODES - r['fell']}/{EVAL_EPISODES}) | {r['pushes']:.1f} | {r['pushes_survived'] * 100:.0f} % "
              f"| {r['base_speed']:.3f} m/s | {r['height']:.3f} m |")


if __name__ == "__main__":
    main()
