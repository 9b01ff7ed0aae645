"""Host synchronisations on the quadruped's hot path, and the cost of an env step, on a GPU.

Runs ``QuadrupedWalk`` (float64 and float32) for one warm-up step (memoised
constants are built on first use), then watches two env steps, the backward
through them and a 5-step ``Simulator.rollout`` under
``torch.cuda.set_sync_debug_mode("warn")`` and prints every code site that
synchronised with the host (innermost backdrive frames first, with counts).
The unilateral contact step's documented test (``active_set_passes``) is
expected; any other site is a regression. Then it times ``env.step`` at
``--batches`` envs (float32) and counts the GPU kernels and aten calls of one
step with ``torch.profiler``.

    python benchmarks/cuda_syncs.py                      # on cuda
    python benchmarks/cuda_syncs.py --batches 4096 65536

On a machine without CUDA it stops with a message.
"""

from __future__ import annotations

import argparse
import collections
import time
import traceback
import warnings

import torch

from backdrive.envs import QuadrupedWalk
from backdrive.sim import State


def sync_sites(device: torch.device) -> collections.Counter:
    sites: collections.Counter = collections.Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        frames = [f for f in traceback.extract_stack()[:-1] if "backdrive" in f.filename]
        sites[" <- ".join(f"{f.filename.split('src/')[-1]}:{f.lineno}" for f in reversed(frames[-4:]))] += 1

    for dtype in (torch.float64, torch.float32):
        env = QuadrupedWalk(4, gait_frequency=3.0, gait_amplitude=0.15, dtype=dtype, device=device)
        env.reset(seed=1)
        a = torch.full((4, 12), 0.1, dtype=dtype, device=device, requires_grad=True)
        env.step(a.detach())  # warm-up: memoised constants
        p = env.split(env.state)
        u = (env.q_stand + 0.1).expand(env.num_envs, 12)[:, None, :].expand(-1, 5, -1)
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            torch.cuda.set_sync_debug_mode("warn")
            try:
                total = 0
                for _ in range(2):
                    obs, reward, *_ = env.step(a)
                    total = total + reward.sum() + obs.sum()
                total.backward()
                env.sim.rollout(State(p["q"], p["v"]), u, check_finite=False)
            finally:
                torch.cuda.set_sync_debug_mode(0)
    return sites


def step_cost(device: torch.device, n: int) -> str:
    env = QuadrupedWalk(n, gait_frequency=3.0, gait_amplitude=0.15, dtype=torch.float32, device=device)
    env.reset(seed=1)
    a = torch.zeros((n, 12), device=device)
    for _ in range(3):
        env.step(a)
    torch.cuda.synchronize(device)
    t = time.perf_counter()
    for _ in range(10):
        env.step(a)
    torch.cuda.synchronize(device)
    dt = (time.perf_counter() - t) / 10
    with torch.profiler.profile() as prof:
        env.step(a)
        torch.cuda.synchronize(device)
    ev = prof.key_averages()
    kernels = sum(e.count for e in ev if e.device_type == torch.autograd.DeviceType.CUDA)
    ops = sum(e.count for e in ev if e.key.startswith("aten::"))
    return (f"| {n} | {dt * 1e3:.1f} | {n / dt:.0f} | {kernels} | {ops} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", type=int, nargs="*", default=[4096, 65536])
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type != "cuda" or not torch.cuda.is_available():
        raise SystemExit("cuda_syncs: needs a CUDA device (torch sees none, or --device is not cuda)")
    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    sites = sync_sites(device)
    for site, n in sites.most_common():
        print(f"sync x{n}: {site}")
    print(f"{len(sites)} site(s) synchronised after the warm-up step\n")
    if args.batches:
        print("| envs | env.step, ms | env steps/s | GPU kernels per step | aten calls per step |")
        print("| --- | --- | --- | --- | --- |")
        for n in args.batches:
            print(step_cost(device, n))


if __name__ == "__main__":
    main()
