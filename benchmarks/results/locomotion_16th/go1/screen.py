"""Screening runs of Go1 recipe candidates (16th session, issue 12: a Go1 policy that follows the command).

Registers one candidate preset (a variant of ``GO1_WALK_SHAC_SLIP``) and runs
``examples/quadruped_walk.py``'s ``main`` with it, so the validation (8 robots x
4 s, seed 123, every 25 updates) and the test (16 x 10 s at 0.5 m/s, seed 999)
are the example's:

    PYTHONPATH=src python benchmarks/results/locomotion_16th/go1/screen.py CANDIDATE --seed S --out outputs/go1cmd/CANDIDATE_sS
"""

from __future__ import annotations

import dataclasses
import runpy
import sys
from pathlib import Path

from backdrive.optim._policy import presets as P

ROOT = Path(__file__).resolve().parents[4]
BASE = P.GO1_WALK_SHAC_SLIP

CANDIDATES = {
    # 2x the run (300 updates), both learning rates decaying linearly to 0 at the last update
    # (as QUADRUPED_WALK_SHAC_DECAY does at 420; 420 Go1 updates would be ~14-15 CPU min of training)
    "long300": dict(config=BASE.config.replace(lr_decay_updates=300), updates=300),
}

name = sys.argv[1]
cand = dataclasses.replace(BASE, name=f"go1cmd_{name}", **CANDIDATES[name])
P.PRESETS[cand.name] = cand
print(repr(cand), flush=True)
sys.argv = [str(ROOT / "examples" / "quadruped_walk.py"), "--preset", cand.name, *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
