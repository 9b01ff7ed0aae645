"""Screening runs of Go1 recipe candidates (15th session, issue 12: a Go1 recipe that passes on seed 1).

Registers one candidate preset (a variant of ``GO1_WALK_SHAC_SLIP``) and runs
``examples/quadruped_walk.py``'s ``main`` with it, so the validation (8 robots x
4 s, seed 123, every 25 updates) and the test (16 x 10 s at 0.5 m/s, seed 999)
are the example's:

    PYTHONPATH=src python benchmarks/results/locomotion_15th/go1/screen.py CANDIDATE --seed 1 --out outputs/go1s1/CANDIDATE_s1
"""

from __future__ import annotations

import dataclasses
import runpy
import sys
from pathlib import Path

from backdrive.optim._policy import presets as P

ROOT = Path(__file__).resolve().parents[4]
BASE = P.GO1_WALK_SHAC_SLIP
W = BASE.env_kwargs["reward_weights"]

CANDIDATES = {
    # the speed-tracking weight doubled (1.0 -> 2.0), the 10x slip penalty kept
    "trk2": dict(env_kwargs={**BASE.env_kwargs, "reward_weights": {**W, "tracking_lin": 2.0}}),
    # 1.5x the run (225 updates), the decay scaled with it (to 0 at update 250)
    "long": dict(config=BASE.config.replace(lr_decay_updates=250), updates=225),
}

name = sys.argv[1]
cand = dataclasses.replace(BASE, name=f"go1s1_{name}", **CANDIDATES[name])
P.PRESETS[cand.name] = cand
print(repr(cand), flush=True)
sys.argv = [str(ROOT / "examples" / "quadruped_walk.py"), "--preset", cand.name, *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
