"""1,000 random drops per robot, forward and backward: do states, contact forces
and gradients stay finite? (issue 11, *Fuzz*)

The quadruped (every URDF shape in contact, cylinders as capsules) and the G1
humanoid (its foot spheres plus spheres and capsules on the body) are dropped
from the random states of ``tests/test_contact_fuzz.py`` (uniform random
orientation, joint angles inside the limits, lowest shape 2 cm inside to 4 cm
above the ground, pushes of up to 3 m/s, falls of 1-3 m/s, spinning base and
joints, random PD targets), in batches of 250 with different seeds, for 30
steps of 2 ms with ``checkpoint_every=20``, pushed half-way (a random
horizontal 0-3 m/s and N(0, 2) rad/s jump of the base velocity, landed or
not), 30 more steps, then back-propagated from a loss on both parts' final
states, contact forces and slip to the initial states, the controls and the
pushes. A rollout that explodes raises ``NonFiniteError`` (naming the step
and the contact); any other exception and every sample with a non-finite
gradient is counted.

Usage::

    PYTHONPATH=src:tests python benchmarks/contact_fuzz.py [--batches 4] [--batch 250] [--steps 60] [--seed 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from test_contact_fuzz import fuzz, g1_sim, quadruped_sim  # noqa: E402

from backdrive import NonFiniteError  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--batch", type=int, default=250)
    p.add_argument("--steps", type=int, default=60, help="steps in all (the push comes after half of them)")
    p.add_argument("--seed", type=int, default=1, help="seed of the first batch (the suite uses seed 0)")
    p.add_argument("--robots", default="quadruped,g1")
    a = p.parse_args()
    torch.set_num_threads(1)
    print("| robot | rollouts | steps | seeds | touched the ground | exploded (NonFiniteError) | other errors "
          "| non-finite gradients | max speed (m/s) | max contact force (N) | max gradient entry | CPU s |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in a.robots.split(","):
        sim = quadruped_sim() if name == "quadruped" else g1_sim()
        touched = exploded = other = bad_grad = 0
        vmax = fmax = gmax = 0.0
        t0 = time.process_time()
        seeds = range(a.seed, a.seed + a.batches)
        for seed in seeds:
            try:
                trajs, grads, frac = fuzz(sim, a.batch, a.steps, seed, checkpoint_every=20)
            except NonFiniteError as err:
                exploded += a.batch
                print(f"<!-- {name} seed {seed}: NonFiniteError: {err} -->", flush=True)
                continue
            except Exception as err:  # noqa: BLE001 - counted: every failure must be a NonFiniteError
                other += a.batch
                print(f"<!-- {name} seed {seed}: {type(err).__name__}: {err} -->", flush=True)
                continue
            touched += round(frac * a.batch)
            for traj in trajs:
                vmax = max(vmax, float(traj.v.detach().abs().max()))
                fmax = max(fmax, float(traj.contact.force.detach().norm(dim=-1).max()))
            for g in grads:
                finite = torch.isfinite(g).flatten(1).all(-1)
                bad_grad += int((~finite).sum())
                gmax = max(gmax, float(g[finite].abs().max()) if bool(finite.any()) else 0.0)
        cpu = time.process_time() - t0
        print(
            f"| {name} | {a.batches * a.batch} | {a.steps} | {seeds.start}-{seeds.stop - 1} | {touched} | {exploded} "
            f"| {other} | {bad_grad} | {vmax:.1f} | {fmax:.3g} | {gmax:.3g} | {cpu:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
