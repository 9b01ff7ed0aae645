"""Data-parallel policy training: throughput with 1 and N processes, the all-reduce, and the scaling model.

Each configuration is a real ``torchrun --standalone --nproc_per_node N`` run
of ``train_policy`` with a preset (default ``cartpole_shac``; ``--env`` takes
any preset name or a short alias: ``pendulum``, ``cartpole``, ``panda``, and
new presets as they are added). The global env batch is the preset's unless
``--num-envs`` says otherwise; each process steps ``num_envs / N`` copies.

Measured, per configuration (rank 0 reports):

- seconds per update (median over the updates after ``--warmup``) and env
  steps per second;
- the time every ``torch.distributed.all_reduce`` the trainer made took
  (counted by wrapping the function: the calls, their bytes, their seconds,
  waiting for the slower rank included), as a share of the update;
- with more than one process: the all-reduce time of a flat tensor of the
  real actor and critic gradient sizes (median of ``--reps``), and a
  back-propagation-through-time update of the preset's policy on its env
  with DistributedDataParallel against the trainer's explicit flat
  all-reduce, interleaved;
- each process's CPU seconds per update (``time.process_time``): on a
  loaded machine the wall-clock speed-up shows the load, the CPU-time
  speed-up what the processes would give with a core each;
- with one process: the update time at a second, halved batch, for the
  linear simulation-cost model ``t_update(b) = t0 + c * b``.

The model (printed as markdown, written to ``--out``/scaling.json):

    t_update(B, N) = t0 + c * B / N + k * (alpha + S / bw * 2 (N - 1) / N)

with ``k`` all-reduces of about ``S`` bytes per update (counted), ``alpha``
the latency of one all-reduce and ``bw`` the bus bandwidth (the nccl-tests
definition, NVIDIA/nccl-tests doc/PERFORMANCE.md). Communication costs as
much as simulation when ``c * B / N = k * (alpha + ...)``, at the per-process
batch ``b* = k * (alpha + ...) / c``. docs/scaling.md has the table and the
published bandwidths used for GPU and multi-node estimates.

    python benchmarks/scaling.py                          # cartpole SHAC, 1 and 2 processes
    python benchmarks/scaling.py --env pendulum --procs 1 2 4
    python benchmarks/scaling.py --env cartpole --num-envs 256 --updates 20
    python benchmarks/scaling.py --device auto --procs 1 2 4 8  # one GPU per process (nccl)
    python benchmarks/scaling.py --compile-step --compile-batches 64 1024   # compile_step vs eager, one process
    python benchmarks/scaling.py --compile-env --compile-batches 64 --compile-reps 10  # QuadrupedWalk(compile=True)
    python benchmarks/scaling.py --env quadruped --env-compile inductor --updates 8 --warmup 3  # torchrun, compiled env

Every process runs one torch thread (``OMP_NUM_THREADS=1``), so 2 processes
use 2 cores where 1 process uses 1: on a shared machine the ratio is only
meaningful when the cores are otherwise idle.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch

ALIASES = {
    "pendulum": "pendulum_shac",
    "cartpole": "cartpole_shac",
    "panda": "panda_reach_apg",
    "quadruped": "quadruped_walk_shac",
}


def _preset(name: str):
    from backdrive.optim._policy.presets import PRESETS, get_preset

    key = ALIASES.get(name, name)
    if key not in PRESETS:
        # A preset named after the env (e.g. "quadruped" -> "quadruped_shac").
        hits = [p for p in PRESETS if p.startswith(key + "_")]
        key = hits[0] if hits else key
    return get_preset(key)


# ------------------------------------------------------------------ worker
def _device(name: str) -> torch.device:
    from backdrive.optim import local_device

    return local_device() if name == "auto" else torch.device(name)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_all_reduce(numel: int, reps: int, device: torch.device, dtype=torch.float32) -> float:
    import torch.distributed as dist

    x = torch.zeros(numel, dtype=dtype, device=device)
    for _ in range(5):
        dist.all_reduce(x)
    times = []
    for _ in range(reps):
        dist.barrier()
        _sync(device)
        t0 = time.perf_counter()
        dist.all_reduce(x)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _bptt_ddp_vs_flat(preset, env, reps: int) -> dict:
    """One BPTT actor update of the preset's policy on this rank's env, DDP vs one flat all-reduce."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from backdrive.optim import MLPPolicy
    from backdrive.optim._policy.distributed import DataParallel

    c = preset.config
    torch.manual_seed(0)
    policy = MLPPolicy(env.obs_dim, env.action_dim, env.action_low, env.action_high, c.hidden, c.activation, c.squash)
    policy = policy.to(dtype=env.dtype, device=env.device)
    ddp = DDP(policy)
    dp = DataParallel(dist.get_rank(), dist.get_world_size(), dist.get_backend(), env.device)
    params = list(policy.parameters())

    def window(module):
        env.reset(seed=1)
        obs, total = env.observation(), 0.0
        for _ in range(c.horizon):
            obs, reward, *_ = env.step(module(obs))
            total = total + reward.mean()
        return -total / c.horizon

    def flat():
        policy.zero_grad(set_to_none=True)
        window(policy).backward()
        dp.average_gradients(params)

    def with_ddp():
        policy.zero_grad(set_to_none=True)
        window(ddp).backward()  # DDP's hooks all-reduce the buckets during backward

    out = {"flat": [], "ddp": []}
    for name, fn in (("flat", flat), ("ddp", with_ddp)):
        fn()  # warm-up
    for _ in range(reps):
        for name, fn in (("flat", flat), ("ddp", with_ddp)):
            dist.barrier()
            _sync(env.device)
            t0 = time.perf_counter()
            fn()
            _sync(env.device)
            out[name].append(time.perf_counter() - t0)
    # Both give the same averaged gradient (checked, not assumed).
    flat()
    g_flat = torch.cat([p.grad.reshape(-1) for p in params]).clone()
    with_ddp()
    g_ddp = torch.cat([p.grad.reshape(-1) for p in params])
    return {
        "flat_s": statistics.median(out["flat"]),
        "ddp_s": statistics.median(out["ddp"]),
        "grads_agree": bool(torch.allclose(g_flat, g_ddp, rtol=1e-4, atol=1e-7)),
    }


def worker(args) -> None:
    torch.set_num_threads(1)
    import torch.distributed as dist

    from backdrive.optim import train_policy

    # A batch other than the preset's is the point here, not a mistake.
    warnings.filterwarnings("ignore", message=".*was tuned on.*")

    preset = _preset(args.env)
    num_envs = args.num_envs or int(preset.env_kwargs.get("num_envs", 1))
    world = int(os.environ.get("WORLD_SIZE", "1"))

    # Count and time every all-reduce the trainer makes.
    calls = {"n": 0, "bytes": 0, "s": 0.0, "cpu_s": 0.0}
    real_all_reduce = dist.all_reduce

    def counted(tensor, *a, **kw):
        t0, c0 = time.perf_counter(), time.process_time()
        out = real_all_reduce(tensor, *a, **kw)
        calls["s"] += time.perf_counter() - t0
        calls["cpu_s"] += time.process_time() - c0
        calls["n"] += 1
        calls["bytes"] += tensor.numel() * tensor.element_size()
        return out

    dist.all_reduce = counted
    stamps: list[float] = []
    cpu: list[float] = []
    comm_at: list[tuple[int, int, float]] = []

    def tick(row):
        stamps.append(time.perf_counter())
        cpu.append(time.process_time())
        comm_at.append((calls["n"], calls["bytes"], calls["s"], calls["cpu_s"]))

    extra = {"compile": True if args.env_compile == "inductor" else args.env_compile} if args.env_compile else {}
    env = preset.make_env(num_envs=num_envs, device=_device(args.device), **extra)
    t = train_policy(env, preset=preset, updates=args.updates, callback=tick)
    dist.all_reduce = real_all_reduce
    w = args.warmup
    per_update = [b - a for a, b in zip(stamps[w:], stamps[w + 1 :])]
    n_updates = len(per_update)
    result = {
        "env": args.env,
        "preset": preset.name,
        "world_size": world,
        "num_envs": num_envs,
        "envs_per_process": t.env.num_envs,
        "horizon": preset.config.horizon,
        "update_s": statistics.median(per_update),
        "update_s_all": per_update,
        # This process's CPU seconds per update: what the update costs when
        # the process has a core to itself (a loaded machine stretches the
        # wall-clock time, much less the CPU time).
        "update_cpu_s": statistics.median([b - a for a, b in zip(cpu[w:], cpu[w + 1 :])]),
        "env_steps_per_s": num_envs * preset.config.horizon / statistics.median(per_update),
        "allreduce_calls_per_update": (comm_at[-1][0] - comm_at[w][0]) / n_updates,
        "allreduce_bytes_per_update": (comm_at[-1][1] - comm_at[w][1]) / n_updates,
        "allreduce_s_per_update": (comm_at[-1][2] - comm_at[w][2]) / n_updates,
        "allreduce_cpu_s_per_update": (comm_at[-1][3] - comm_at[w][3]) / n_updates,
        "actor_params": sum(p.numel() for p in t.policy.parameters()),
        "critic_params": sum(p.numel() for p in t.critic.parameters()),
        "dtype": str(env.dtype),
        "device": str(env.device),
    }
    if world > 1:
        result["allreduce_actor_s"] = _time_all_reduce(result["actor_params"], args.reps, env.device)
        result["allreduce_critic_s"] = _time_all_reduce(result["critic_params"], args.reps, env.device)
        result["allreduce_1_s"] = _time_all_reduce(1, args.reps, env.device)
        result["bptt"] = _bptt_ddp_vs_flat(preset, t.env, max(5, args.reps // 20))
    else:
        # The same preset at half the batch: the slope of the simulation cost.
        half = max(1, num_envs // 2)
        stamps.clear()
        cpu.clear()
        t2 = train_policy(preset.make_env(num_envs=half, device=env.device, **extra), preset=preset,
                          updates=args.updates, callback=tick)
        result["half_num_envs"] = half
        result["half_update_s"] = statistics.median([b - a for a, b in zip(stamps[w:], stamps[w + 1 :])])
        result["half_update_cpu_s"] = statistics.median([b - a for a, b in zip(cpu[w:], cpu[w + 1 :])])
        del t2
    if int(os.environ.get("RANK", "0")) == 0:
        Path(args.result).write_text(json.dumps(result, indent=1))


# ------------------------------------------------------- compiled contact step
def compile_step_bench(args) -> None:
    """Eager ``Simulator.step`` against :func:`backdrive.sim.compile_step`, on the quadruped's contact step.

    For each batch: the compile time (the first compiled call, minus an
    eager step), then ``--reps`` rounds of eager and compiled steps
    interleaved (CPU seconds, one torch thread), without and with a
    backward pass; medians and their ratio. Each row is printed and appended
    to ``--out``/compile_step.json as soon as it is measured (compilation
    can take minutes on a CPU).
    """
    torch.set_num_threads(1)
    from backdrive.envs import QuadrupedWalk
    from backdrive.sim import State, compile_step

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    dtype = {"float32": torch.float32, "float64": torch.float64}[args.dtype]
    for batch in args.compile_batches:
        env = QuadrupedWalk(batch, gait_frequency=3.0, gait_amplitude=0.15, dtype=dtype, device=_device(args.device))
        env.reset(seed=0)
        sim = env.sim
        p = env.split(env.state)
        q, v = p["q"].clone(), p["v"].clone()
        u = (env.q_stand + 0.1).expand(batch, 12).clone()
        for grad in (False, True):
            step = compile_step(sim, backend=args.compile_backend)
            qg, vg, ug = (x.clone().requires_grad_(grad) for x in (q, v, u))

            def run(fn):
                s1 = fn(State(qg, vg), ug, check_finite=False)
                if grad:
                    (s1.q.sum() + s1.v.sum()).backward()
                return s1

            def timed(fn):
                _sync(q.device)
                t0 = time.process_time()
                run(fn)
                _sync(q.device)
                return time.process_time() - t0

            eager_first = timed(sim.step)
            t0, c0 = time.perf_counter(), time.process_time()
            ref, got = run(sim.step), run(step)
            compile_wall, compile_cpu = time.perf_counter() - t0, time.process_time() - c0
            err = max(float((got.q - ref.q).abs().max()), float((got.v - ref.v).abs().max()))
            rel = max(float((got.q - ref.q).abs().max() / ref.q.abs().max()),
                      float((got.v - ref.v).abs().max() / ref.v.abs().max()))
            eager, compiled = [], []
            for _ in range(args.compile_reps):
                eager.append(timed(sim.step))
                compiled.append(timed(step))
            row = {
                "batch": batch, "dtype": args.dtype, "backward": grad, "backend": args.compile_backend,
                "compiled": step.compiled, "eager_reason": step.eager_reason,
                "compile_wall_s": compile_wall, "compile_cpu_s": compile_cpu, "eager_first_s": eager_first,
                "eager_s": statistics.median(eager), "compiled_s": statistics.median(compiled),
                "max_abs_diff": err, "max_rel_diff": rel, "load_average": os.getloadavg()[0],
            }
            row["compiled_over_eager"] = row["compiled_s"] / row["eager_s"]
            rows.append(row)
            print(f"batch {batch} {args.dtype} {'forward+backward' if grad else 'forward'}: eager "
                  f"{row['eager_s'] * 1e3:.2f} ms, compiled {row['compiled_s'] * 1e3:.2f} ms (ratio "
                  f"{row['compiled_over_eager']:.2f}; compiled={step.compiled}), compile {compile_cpu:.0f} CPU s "
                  f"({compile_wall:.0f} s wall), max |diff| {err:.2e} ({rel:.1e} of the largest entry), load "
                  f"{row['load_average']:.1f}", flush=True)
            (out / "compile_step.json").write_text(json.dumps(rows, indent=1))


def compile_env_bench(args) -> None:
    """``QuadrupedWalk(compile=...)`` against the eager env: one env step (4 contact substeps), forward and gradient.

    The ``quadruped_walk_shac`` preset's env at each ``--compile-batches``
    batch, built twice (eager, and compiled with ``--compile-backend``),
    reset with the same seed. Per pass (forward without grad; forward and
    the backward pass of a weighted sum of the next state to the action):
    the first compiled call's CPU and wall seconds (the compilation), the
    largest difference of the next states (relative to the largest entry)
    and of the action gradients, then ``--compile-reps`` interleaved eager
    and compiled calls from the same state (CPU seconds, one torch thread);
    medians and their ratio. Rows go to ``--out``/compile_env.json as they
    are measured.
    """
    torch.set_num_threads(1)
    preset = _preset("quadruped")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    dtype = {"float32": torch.float32, "float64": torch.float64}[args.dtype]
    for batch in args.compile_batches:
        kw = {**preset.env_kwargs, "num_envs": batch, "dtype": dtype, "device": _device(args.device)}
        eager_env, env = preset.env_type(**kw), preset.env_type(**kw, compile=args.compile_backend)
        eager_env.reset(seed=0)
        env.reset(seed=0)
        state = eager_env.state.clone()
        g = torch.Generator().manual_seed(0)
        action = (0.5 * torch.randn(batch, 12, generator=g, dtype=dtype)).to(state.device)
        w = torch.randn(state.shape, generator=g, dtype=dtype).to(state.device)
        for grad in (False, True):

            def run(e):
                a = action.clone().requires_grad_(grad)
                with torch.set_grad_enabled(grad):
                    s1 = e.transition(state, a)
                    ga = torch.autograd.grad((s1 * w).sum(), a)[0] if grad else None
                return s1.detach(), ga

            def timed(e):
                _sync(state.device)
                t0 = time.process_time()
                run(e)
                _sync(state.device)
                return time.process_time() - t0

            timed(eager_env)
            t0, c0 = time.perf_counter(), time.process_time()
            got = run(env)
            compile_wall, compile_cpu = time.perf_counter() - t0, time.process_time() - c0
            ref = run(eager_env)
            finite = torch.isfinite(ref[0]).all(-1) & torch.isfinite(got[0]).all(-1)
            rel = float((got[0] - ref[0])[finite].abs().max() / ref[0][finite].abs().max())
            grel = float((got[1] - ref[1]).abs().max() / ref[1].abs().max()) if grad else None
            eager, compiled = [], []
            for _ in range(args.compile_reps):
                eager.append(timed(eager_env))
                compiled.append(timed(env))
            row = {
                "batch": batch, "dtype": args.dtype, "backward": grad, "backend": args.compile_backend,
                "compiled": env.compiled_step.compiled, "eager_reason": env.compiled_step.eager_reason,
                "compile_wall_s": compile_wall, "compile_cpu_s": compile_cpu,
                "eager_s": statistics.median(eager), "compiled_s": statistics.median(compiled),
                "state_rel_diff": rel, "grad_rel_diff": grel, "finite_copies": int(finite.sum()),
                "load_average": os.getloadavg()[0],
            }
            row["compiled_over_eager"] = row["compiled_s"] / row["eager_s"]
            rows.append(row)
            print(f"QuadrupedWalk env step, batch {batch} {args.dtype} {'forward+gradient' if grad else 'forward'}: "
                  f"eager {row['eager_s'] * 1e3:.1f} ms, compiled {row['compiled_s'] * 1e3:.1f} ms (ratio "
                  f"{row['compiled_over_eager']:.2f}; compiled={row['compiled']}), first compiled call "
                  f"{compile_cpu:.0f} CPU s ({compile_wall:.0f} s wall), next state {rel:.1e} of the largest "
                  f"entry" + (f", action gradient {grel:.1e}" if grad else "") + f", load {row['load_average']:.1f}",
                  flush=True)
            (out / "compile_env.json").write_text(json.dumps(rows, indent=1))


# ------------------------------------------------------------------ parent
def _launch(args, nproc: int, out: Path) -> dict:
    result = out / f"scaling_{args.env}_{nproc}p.json"
    result.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           __file__, "--worker", "--env", args.env, "--updates", str(args.updates), "--warmup", str(args.warmup),
           "--reps", str(args.reps), "--result", str(result)]
    if args.num_envs:
        cmd += ["--num-envs", str(args.num_envs)]
    if args.env_compile:
        cmd += ["--env-compile", args.env_compile]
    cmd += ["--device", args.device]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, timeout=args.timeout)
    data = json.loads(result.read_text())
    data["launch_s"] = time.perf_counter() - t0
    return data


def model(runs: dict[int, dict]) -> dict:
    """The linear cost model from the measurements (see the module docstring)."""
    one = runs[1]
    b, bh = one["num_envs"], one["half_num_envs"]
    # CPU seconds: on a shared machine the wall clock measures the load as
    # much as the work; the fit in wall seconds is kept for comparison.
    c = (one["update_cpu_s"] - one["half_update_cpu_s"]) / (b - bh)  # CPU seconds per env copy per update
    t0 = one["update_cpu_s"] - c * b
    c_wall = (one["update_s"] - one["half_update_s"]) / (b - bh)
    out = {"c_s_per_env": c, "t0_s": t0, "c_wall_s_per_env": c_wall, "t0_wall_s": one["update_s"] - c_wall * b}
    for n, r in runs.items():
        if n == 1:
            continue
        comm = r["allreduce_s_per_update"]
        out[n] = {
            "predicted_update_cpu_s": t0 + c * b / n + r["allreduce_cpu_s_per_update"],
            "measured_update_cpu_s": r["update_cpu_s"],
            "comm_s_per_update": comm,
            "comm_cpu_s_per_update": r["allreduce_cpu_s_per_update"],
            # The per-process batch at which the all-reduces cost as much as the simulation.
            "break_even_envs_per_process": comm / c if c > 0 else float("inf"),
            "break_even_envs_per_process_cpu": r["allreduce_cpu_s_per_update"] / c if c > 0 else float("inf"),
            "allreduce_latency_s": r["allreduce_1_s"],
            "break_even_envs_per_process_latency_only": r["allreduce_calls_per_update"] * r["allreduce_1_s"] / c
            if c > 0 else float("inf"),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="cartpole", help="preset name or alias: pendulum, cartpole, panda, ...")
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--num-envs", type=int, default=None, help="global env batch (default: the preset's)")
    ap.add_argument("--updates", type=int, default=14)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=200, help="repetitions of the all-reduce timings")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, or auto (cuda:LOCAL_RANK when CUDA exists)")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", default="outputs/scaling")
    ap.add_argument("--compile-step", action="store_true",
                    help="instead: eager vs compile_step on the quadruped's contact step (one process)")
    ap.add_argument("--env-compile", default=None, metavar="BACKEND",
                    help="train with the env's compiled step (QuadrupedWalk(compile=...)): inductor, aot_eager, ...; "
                         "each process compiles its own graphs first (minutes; raise --warmup)")
    ap.add_argument("--compile-env", action="store_true",
                    help="instead: QuadrupedWalk(compile=...) vs the eager env, one env step (one process)")
    ap.add_argument("--compile-batches", type=int, nargs="+", default=[64, 1024])
    ap.add_argument("--compile-reps", type=int, default=15)
    ap.add_argument("--compile-backend", default="inductor")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"], help="of --compile-step")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    if args.compile_step:
        compile_step_bench(args)
        return
    if args.compile_env:
        compile_env_bench(args)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    procs = sorted(set(args.procs) | {1})
    runs = {n: _launch(args, n, out) for n in procs}
    m = model(runs)
    one = runs[1]
    print(f"\n{one['preset']}: global batch {one['num_envs']}, horizon {one['horizon']}, {one['dtype']} on "
          f"{one['device']}, "
          f"actor {one['actor_params']} / critic {one['critic_params']} parameters; "
          f"{os.cpu_count()} CPUs (load average {os.getloadavg()[0]:.1f} after the runs), torch {torch.__version__}, "
          f"{platform.machine()}\n")
    print("| processes | envs/process | s/update | env steps/s | speed-up | CPU s/update/process | "
          "CPU speed-up | all-reduces/update | KiB/update | all-reduce s/update (share) | all-reduce CPU s/update |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n, r in runs.items():
        print(f"| {n} | {r['envs_per_process']} | {r['update_s']:.4f} | {r['env_steps_per_s']:.0f} | "
              f"{one['update_s'] / r['update_s']:.2f} | {r['update_cpu_s']:.4f} | "
              f"{one['update_cpu_s'] / r['update_cpu_s']:.2f} | {r['allreduce_calls_per_update']:.0f} | "
              f"{r['allreduce_bytes_per_update'] / 1024:.1f} | {r['allreduce_s_per_update']:.4f} "
              f"({r['allreduce_s_per_update'] / r['update_s']:.0%}) | {r['allreduce_cpu_s_per_update']:.4f} |")
    print(f"\nmodel (CPU seconds): t_update = {m['t0_s'] * 1e3:.1f} ms + {m['c_s_per_env'] * 1e6:.1f} us x "
          f"envs/process (+ all-reduces); in wall seconds {m['t0_wall_s'] * 1e3:.1f} ms + "
          f"{m['c_wall_s_per_env'] * 1e6:.1f} us x envs/process; from 1 process at {one['num_envs']} and "
          f"{one['half_num_envs']} envs")
    for n, r in runs.items():
        if n == 1:
            continue
        mm = m[n]
        print(f"- {n} processes: predicted {mm['predicted_update_cpu_s']:.4f} CPU s/update, measured "
              f"{mm['measured_update_cpu_s']:.4f}; all-reduce of {r['actor_params']} floats "
              f"{r['allreduce_actor_s'] * 1e6:.0f} us, "
              f"of {r['critic_params']} floats {r['allreduce_critic_s'] * 1e6:.0f} us, of 1 float "
              f"{r['allreduce_1_s'] * 1e6:.0f} us (gloo); communication = simulation at "
              f"{mm['break_even_envs_per_process']:.0f} envs per process (all-reduce wall time as measured in "
              f"training, waiting for the slower rank included), {mm['break_even_envs_per_process_cpu']:.0f} "
              f"(their CPU time), "
              f"{mm['break_even_envs_per_process_latency_only']:.0f} (latency of the all-reduces alone)")
        b = r["bptt"]
        print(f"- BPTT actor update, {r['envs_per_process']} envs/process: flat all-reduce {b['flat_s'] * 1e3:.2f} ms, "
              f"DDP {b['ddp_s'] * 1e3:.2f} ms (DDP/flat {b['ddp_s'] / b['flat_s']:.2f}); gradients agree: "
              f"{b['grads_agree']}")
    (out / f"scaling_{args.env}.json").write_text(json.dumps({"runs": runs, "model": m}, indent=1, default=str))


if __name__ == "__main__":
    main()
