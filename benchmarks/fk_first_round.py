"""The reference FK kernel's first round fused with the local transforms
(``_fk.jump_first``) against the local transforms and their products
(``_fk.jump_locals`` then every round of ``_fk.jump_compose``), in one
process, interleaved: the Panda chain's pose (``panda_hand_tcp``) and the
Panda tree's reference FK (all bodies), forward only, thread CPU time,
minimum and median of ``REPEATS`` (default 21) repeats.

    python benchmarks/fk_first_round.py [float32|float64] [64,256,1000,4096,10000]

Prints a markdown table of fused/unfused (below 1: the fused round is faster).
"""
import os
import statistics
import sys
import time

import torch

from backdrive.data import get_data_path, load
from backdrive.kinematics import SerialChainKinematics, _fk

torch.set_num_threads(int(os.environ.get("THREADS", "1")))
dtype = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "float32")
batches = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "64,256,1000,4096,10000").split(",")]
REPEATS = int(os.environ.get("REPEATS", "21"))

chain = SerialChainKinematics.from_urdf(str(get_data_path("panda")), end_link_name="panda_hand_tcp", dtype=dtype)
robot = load("panda").to(dtype=dtype)
cache = _fk._cache(robot)
pairs = (chain._jump_pairs, cache["jump_pairs"])


def setup(fused: bool):
    chain._jump_pairs = pairs[0] if fused else None
    cache["jump_pairs"] = pairs[1] if fused else None


def clock(fn, n):
    t0 = time.thread_time()
    for _ in range(n):
        fn()
    return (time.thread_time() - t0) / n


print("| case | batch | unfused min ms | fused min ms | fused/unfused min | fused/unfused median |")
print("|---|---|---|---|---|---|", flush=True)
g = torch.Generator().manual_seed(0)
for N in batches:
    u = torch.rand(N, chain.dof, generator=g, dtype=torch.float64).to(dtype)
    q = chain.lower + (chain.upper - chain.lower) * u
    qt = robot.random_q(N, generator=g)
    cases = {
        "chain pose": lambda: chain.forward_kinematics(q),
        "tree reference FK": lambda: _fk.body_transforms_reference(robot, qt),
    }
    with torch.no_grad():
        for name, fn in cases.items():
            setup(True)
            inner = max(1, int(0.01 / max(clock(fn, 1), 1e-6)))
            t = {True: [], False: []}
            for _ in range(REPEATS):
                for fused in (False, True):
                    setup(fused)
                    t[fused].append(clock(fn, inner))
            setup(True)
            lo, hi = min(t[False]), min(t[True])
            med = statistics.median(t[True]) / statistics.median(t[False])
            print(f"| {name} | {N:,} | {lo * 1e3:.3f} | {hi * 1e3:.3f} | {hi / lo:.2f} | {med:.2f} |", flush=True)
