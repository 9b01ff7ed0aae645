"""Rollout gradient / forward rollout, eager and with the step compiled.

The scenario of ``benchmarks/contact.py``'s gradient table (the robot settled
by MuJoCo, 100 steps of 4 ms, PD targets wiggled, batch 1, one thread; the
gradient of final base height + 0.1 x with respect to all targets), run with
backdrive's eager contact step and with the same step passed through
``torch.compile`` (inductor; the first call of each runs eagerly so that the
model's caches are built outside the trace). CPU time of this process,
minimum over the repeats, the four runs interleaved. Prints both ratios,
the compiled gradient against the eager forward, the one-off compile cost
and how far the compiled gradient is from the eager one.

    python benchmarks/contact_compiled_gradient.py [quadruped|go1] [float64,float32] [REPEATS]
"""

import sys
import time
from pathlib import Path

import numpy as np
import torch

torch.set_num_threads(1)
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _mujoco_contact as mc  # noqa: E402
import contact as cb  # noqa: E402


_EAGER_SETUP = cb._backdrive_setup


def compiled_setup(robot: str, dtype: str = "float64"):
    """``contact._backdrive_setup`` with its step compiled."""
    bd, contact, step = _EAGER_SETUP(robot, dtype)
    compiled = torch.compile(step, dynamic=False)
    warm = []

    def first_eager(q, v, target, dt):
        if not warm:  # builds the model's caches (topology, schedule) outside the trace
            warm.append(True)
            with torch.no_grad():
                step(q, v, target, dt)
        return compiled(q, v, target, dt)

    return bd, contact, first_eager


def main() -> None:
    robot = sys.argv[1] if len(sys.argv) > 1 else "quadruped"
    dtypes = sys.argv[2].split(",") if len(sys.argv) > 2 else ["float64", "float32"]
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    dt, T = 4e-3, 100
    model = mc.build_model(robot, dt=dt, integrator=cb.INTEGRATOR, stiction_width=cb.CONTACT["stiction_width"])
    qpos, qvel, ctrl = cb.settled_state(model, robot)
    U = cb.gradient_targets(model, ctrl, T, cb.WIGGLE)
    print("| robot | dtype | eager forward | eager gradient | ratio | compiled forward | compiled gradient | ratio "
          "| compiled gradient / eager forward | compile (forward, gradient) | gradients differ |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for dtype in dtypes:
        fe, ge = cb.backdrive_gradient_runner(robot, dt, T, dtype, mj_model=model, qpos=qpos, qvel=qvel, U=U)
        cb._backdrive_setup = compiled_setup
        try:
            fc, gc = cb.backdrive_gradient_runner(robot, dt, T, dtype, mj_model=model, qpos=qpos, qvel=qvel, U=U)
        finally:
            cb._backdrive_setup = _EAGER_SETUP
        t0 = time.process_time()
        fc()
        t1 = time.process_time()
        Gc = gc()
        t2 = time.process_time()
        Ge = ge()
        best = dict.fromkeys(("fe", "ge", "fc", "gc"), float("inf"))
        for _ in range(reps):
            for k, f in (("fe", fe), ("ge", ge), ("fc", fc), ("gc", gc)):
                t = time.process_time()
                f()
                best[k] = min(best[k], time.process_time() - t)
        diff = float(np.abs(Gc - Ge).max() / np.abs(Ge).max())
        ms = {k: f"{v * 1e3:.0f} ms" for k, v in best.items()}
        print(f"| {robot} | {dtype} | {ms['fe']} | {ms['ge']} | {best['ge'] / best['fe']:.2f}x | {ms['fc']} | "
              f"{ms['gc']} | {best['gc'] / best['fc']:.2f}x | {best['gc'] / best['fe']:.2f}x | "
              f"{t1 - t0:.0f} s, {t2 - t1:.0f} s | {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
