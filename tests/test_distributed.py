"""Data-parallel policy training on torch.distributed (gloo, on the CPU).

The multi-process tests start real process groups: each worker is a spawned
Python process that sets the variables ``torchrun`` sets (``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) and calls
``train_policy`` exactly as a script launched by ``torchrun`` would, so the
launcher path is what is tested. Every spawn has a deadline: a hung run
fails the test instead of blocking the suite.
"""

from __future__ import annotations

import atexit
import csv
import functools
import math
import multiprocessing
import os
import socket
import time
import traceback

import pytest
import torch

from backdrive import PolicyConfigError
from backdrive.envs import Pendulum, QuadrupedWalk
from backdrive.optim import PolicyTrainer, train_policy
from backdrive.optim._policy import checkpoints as ckpt_mod
from backdrive.optim._policy.distributed import DataParallel, rank_seed, shard_env

from _torchrun import run_torchrun

B = 8  # global env batch
# SHAC with every random choice that depends on how the batch is split made
# irrelevant: no action noise, one full-batch critic minibatch (its mean is
# the same whatever the permutation). Initial states and resets stay random.
SETTINGS = dict(
    algo="shac",
    horizon=8,
    lr=3e-3,
    critic_lr=3e-3,
    critic_iterations=3,
    critic_minibatches=1,
    critic_replay=2,
    action_noise=0.0,
    hidden=(16, 16),
    seed=3,
)
# Episodes end after 24 steps: at the end of update 3, so the first
# checkpoint (update 3) holds fresh states drawn by each rank's stream, and
# updates 4-5 reach no episode end (the next is at update 6).
EPISODE = 24
TIMEOUT_S = 10  # the process-group time-out of the dead-rank test


class TwoStreams:
    """One process, ``B`` copies, drawn as two ranks of ``B/2`` would draw them.

    Rows ``0..B/2-1`` come from rank 0's seed stream and rows ``B/2..`` from
    rank 1's (:func:`rank_seed`), so one process replays the data of a
    two-process run exactly: the reference for the data-parallel tests.
    """

    def reset(self, seed=None):
        if seed is not None:
            self._streams = [torch.Generator().manual_seed(rank_seed(seed, r)) for r in range(2)]
        return super().reset(seed)

    def initial_state(self, n, generator):
        half = n // 2
        return torch.cat([super(TwoStreams, self).initial_state(half, g) for g in self._streams])


class TwoStreamPendulum(TwoStreams, Pendulum):
    pass


class TwoStreamQuadruped(TwoStreams, QuadrupedWalk):
    pass


# The locomotion workload (issue 16: "the workload worth scaling"): the
# QuadrupedWalk SHAC preset's env (privileged observations, trot prior,
# contact), 2 x 2 copies against 1 x 4, small networks and 2-step windows so
# that three updates take seconds. No copy falls or times out in the 6 steps,
# so every state comes from the two seed streams.
QUAD_SETTINGS = {**SETTINGS, "horizon": 2, "critic_iterations": 2}


def _quad_env(cls=None):
    from backdrive.optim._policy.presets import QUADRUPED_WALK_SHAC

    kw = {**QUADRUPED_WALK_SHAC.env_kwargs, "num_envs": 4, "dtype": torch.float64}
    return (cls or QuadrupedWalk)(**kw)


def _env(cls=Pendulum, n=B, device=None):
    return cls(n, y_init=2.0, max_episode_steps=EPISODE, dtype=torch.float64, device=device)


def _flat(trainer):
    mods = [trainer.policy, trainer.critic, trainer.target_critic]
    return torch.cat([p.detach().reshape(-1) for m in mods for p in m.parameters()])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, job, out_dir):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    result = {}
    try:
        result = globals()[job](rank, out_dir)
    except BaseException as exc:  # reported to the test, which asserts on it
        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _spawn(job, tmp_path, world=2, deadline_s=90.0):
    """Run ``job`` on ``world`` spawned ranks; every rank's result dict, in rank order."""
    ctx = multiprocessing.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, job, str(tmp_path))) for r in range(world)]
    for p in procs:
        p.start()
    end = time.monotonic() + deadline_s
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    assert not hung, f"ranks {hung} still running after {deadline_s} s"
    out = []
    for r in range(world):
        f = tmp_path / f"rank{r}.pt"
        out.append(torch.load(f, weights_only=False) if f.exists() else {"exitcode": procs[r].exitcode})
    return out


# ------------------------------------------------------------------ jobs
def _job_train(rank, out_dir):
    # The bad inputs first, in the same process group (one spawn for both:
    # starting processes is the slow part of these tests).
    errors = _job_bad_inputs(rank, out_dir)
    t = train_policy(_env(), updates=3, checkpoint=os.path.join(out_dir, "dp.pt"),
                     checkpoint_every=3, log_csv=os.path.join(out_dir, "log.csv"), **SETTINGS)
    # Resumed under the same world size: every rank continues its own
    # streams, so the run is the uninterrupted one bit for bit.
    resumed = train_policy(_env(), updates=5, resume=os.path.join(out_dir, "dp.pt"))
    straight = train_policy(_env(), updates=5, **SETTINGS)
    # A one-process checkpoint (written by the test before the spawn), resumed by two.
    from_one = train_policy(_env(), updates=5, resume=os.path.join(out_dir, "one.pt"))
    # A process group that exists already is joined, whoever created it.
    joined = DataParallel.setup("cpu", distributed=True)
    quad = train_policy(_quad_env(), updates=3, **QUAD_SETTINGS)
    return {"params": _flat(t), "mean": t.policy.normalizer.mean, "var": t.policy.normalizer.var,
            "count": t.policy.normalizer.count, "history": t.history, "local_envs": t.env.num_envs,
            "world": t.data_parallel.world_size, "errors": errors,
            "resumed": _flat(resumed), "straight": _flat(straight),
            "resumed_env": resumed.env.state, "straight_env": straight.env.state,
            "from_one": _flat(from_one), "from_one_envs": from_one.env.num_envs,
            "joined": (joined.rank, joined.world_size, joined.backend),
            "quad": _flat(quad), "quad_history": quad.history, "quad_mean": quad.policy.normalizer.mean,
            "quad_envs": quad.env.num_envs}


def _job_bad_inputs(rank, out_dir):
    errors = {}
    cases = {
        "indivisible": lambda: train_policy(_env(n=5), updates=1, **SETTINGS),
        "seed": lambda: train_policy(_env(), updates=1, **{**SETTINGS, "seed": 3 + rank}),
        "config": lambda: train_policy(_env(), updates=1, **{**SETTINGS, "lr": 1e-3 * (1 + rank)}),
        "batch": lambda: train_policy(_env(n=8 + 2 * rank), updates=1, **SETTINGS),
        "updates": lambda: train_policy(_env(), updates=1 + rank, **SETTINGS),
    }
    for name, case in cases.items():
        try:
            case()
            errors[name] = None
        except PolicyConfigError as exc:
            errors[name] = str(exc)
    return errors


def _job_rank_dies(rank, out_dir):
    def die(row):
        if rank == 1 and row["update"] == 2:
            with open(os.path.join(out_dir, "died_at"), "w") as f:
                f.write(repr(time.time()))
            os._exit(7)  # no clean-up, no goodbye: as a crash or an OOM kill

    try:
        train_policy(_env(), updates=1000, callback=die, timeout_s=TIMEOUT_S, **SETTINGS)
    except Exception as exc:
        return {"error_type": type(exc).__name__, "error_at": time.time()}
    return {"error_type": None, "error_at": time.time()}


# ----------------------------------------------------------------- tests
@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dp")
    _reference(3).save(tmp / "one.pt")
    return tmp, _spawn("_job_train", tmp, deadline_s=150)


@functools.lru_cache(maxsize=None)
def _reference(updates):
    """One process, ``B`` envs, the same data; run to ``updates`` (shared by the tests: read only)."""
    return train_policy(_env(TwoStreamPendulum), updates=updates, distributed=False, **SETTINGS)


@pytest.mark.slow
def test_two_processes_match_one_process_with_the_whole_batch(two_rank_run):
    tmp, results = two_rank_run
    for r in results:
        assert "error" not in r, r.get("traceback")
    ref = _reference(3)
    assert [r["local_envs"] for r in results] == [B // 2, B // 2]
    assert [r["world"] for r in results] == [2, 2]
    assert [r["joined"] for r in results] == [(0, 2, "gloo"), (1, 2, "gloo")]
    # Identical parameters on both ranks (the same averaged gradients, the same steps) ...
    assert torch.equal(results[0]["params"], results[1]["params"])
    # ... and those of one process with the whole batch, to float64 rounding.
    moved = (_flat(ref) - _flat(PolicyTrainer(_env(TwoStreamPendulum), distributed=False, **SETTINGS))).abs().max()
    assert moved > 1e-3  # the updates changed the parameters: the match below is not trivial
    torch.testing.assert_close(results[0]["params"], _flat(ref), rtol=1e-9, atol=1e-10)
    # Observation statistics merged over the ranks, as one process computes them.
    torch.testing.assert_close(results[0]["mean"], ref.policy.normalizer.mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(results[1]["var"], ref.policy.normalizer.var, rtol=1e-12, atol=1e-12)
    assert float(results[0]["count"]) == float(ref.policy.normalizer.count) == B * (1 + 3 * 8)
    # The same log: global env steps, returns of episodes that ended on either rank, losses.
    for key in ("env_steps", "train_return", "window_reward", "actor_loss", "critic_loss", "grad_norm"):
        got = [row[key] for row in results[1]["history"]]
        want = [row[key] for row in ref.history]
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12, nan_ok=True), key
    assert math.isfinite(ref.history[-1]["train_return"])  # episodes ended at update 3


@pytest.mark.slow
def test_two_processes_match_one_process_on_the_locomotion_workload(two_rank_run):
    tmp, results = two_rank_run
    for r in results:
        assert "error" not in r, r.get("traceback")
    assert [r["quad_envs"] for r in results] == [2, 2]
    env = _quad_env(TwoStreamQuadruped)
    ref = train_policy(env, updates=3, distributed=False, **QUAD_SETTINGS)
    moved = (_flat(ref) - _flat(PolicyTrainer(_quad_env(TwoStreamQuadruped), distributed=False,
                                              **QUAD_SETTINGS))).abs().max()
    assert moved > 1e-3  # the updates changed the parameters: the match below is not trivial
    assert bool(torch.isfinite(env.state).all())  # no copy fell: every state came from the two streams
    assert torch.equal(results[0]["quad"], results[1]["quad"])
    torch.testing.assert_close(results[0]["quad"], _flat(ref), rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(results[0]["quad_mean"], ref.policy.normalizer.mean, rtol=1e-12, atol=1e-12)
    for key in ("env_steps", "window_reward", "actor_loss", "critic_loss", "grad_norm"):
        got = [row[key] for row in results[1]["quad_history"]]
        want = [row[key] for row in ref.history]
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12, nan_ok=True), key


@pytest.mark.slow
def test_rank_zero_alone_writes_the_log_and_the_checkpoint(two_rank_run):
    tmp, _ = two_rank_run
    with open(tmp / "log.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["update"]) for r in rows] == [1, 2, 3]  # one writer: no duplicated rows
    ck = ckpt_mod.read_checkpoint(tmp / "dp.pt")
    assert ck["world_size"] == 2 and len(ck["rank_generators"]) == 2
    assert ck["env"]["state"].shape == (B, 2)  # the global batch, gathered
    assert ck["replay"][0]["obs"].shape == (8, B, 3)
    assert not [p for p in os.listdir(tmp) if p.endswith(".tmp")]


@pytest.mark.slow
def test_a_two_process_checkpoint_resumes_exactly_in_two_processes(two_rank_run):
    _, results = two_rank_run
    for r in results:
        assert torch.equal(r["resumed"], r["straight"])
        assert torch.equal(r["resumed_env"], r["straight_env"])
    assert not torch.equal(results[0]["resumed_env"], results[1]["resumed_env"])  # each rank its own slice


@pytest.mark.slow
def test_a_one_process_checkpoint_resumes_in_two_processes(two_rank_run):
    _, results = two_rank_run
    # As below: no episode ends in updates 4-5, so the new split's fresh streams do not matter.
    ref = _reference(5)
    for r in results:
        assert r["from_one_envs"] == B // 2
        torch.testing.assert_close(r["from_one"], _flat(ref), rtol=1e-9, atol=1e-10)


@pytest.mark.slow
def test_a_two_process_checkpoint_resumes_in_one_process(two_rank_run):
    tmp, results = two_rank_run
    resumed = train_policy(_env(), updates=5, resume=tmp / "dp.pt", distributed=False)
    assert resumed.env.num_envs == B and resumed.updates_done == 5
    assert resumed.config == PolicyTrainer(_env(), distributed=False, **SETTINGS).config
    # No episode ends in updates 4-5, so the fresh random streams of a new
    # split do not matter there: the continuation is the reference's.
    ref = _reference(5)
    torch.testing.assert_close(_flat(resumed), _flat(ref), rtol=1e-9, atol=1e-10)
    assert [row["update"] for row in resumed.history] == [1, 2, 3, 4, 5]
    assert resumed.env_steps == 5 * B * SETTINGS["horizon"]


@pytest.mark.slow
def test_bad_world_size_and_mismatched_ranks_are_named_errors(two_rank_run):
    _, results = two_rank_run
    for r in results:
        assert "error" not in r, r.get("traceback")
        errors = r["errors"]
        assert "num_envs = 5 is not divisible by the world size 2" in errors["indivisible"]
        assert "seed: rank 0 3 vs rank 1 4" in errors["seed"]
        assert "lr: rank 0 0.001 vs rank 1 0.002" in errors["config"]
        assert "num_envs: rank 0 8 vs rank 1 10" in errors["batch"]
        assert "train() arguments" in errors["updates"] and "updates: rank 0 1 vs rank 1 2" in errors["updates"]


@pytest.mark.slow
def test_a_rank_that_dies_does_not_hang_the_others(tmp_path):
    r0, r1 = _spawn("_job_rank_dies", tmp_path, deadline_s=180)
    assert r1 == {"exitcode": 7}
    # Rank 0 gets an error instead of waiting: at once when the peer's
    # connection closes, at the latest after the process group's time-out
    # (plus slack for this loaded machine).
    assert r0["error_type"] is not None
    waited = r0["error_at"] - float((tmp_path / "died_at").read_text())
    assert 0 <= waited < TIMEOUT_S + 20


# ------------------------------------------------------ one-process parts
def test_rank_seeds():
    assert rank_seed(5, 0) == 5  # one process: the seeds it always had
    seeds = {rank_seed(5, r, k) for r in range(8) for k in range(3)}
    assert len(seeds) == 24 and all(0 <= s < 2**63 for s in seeds)
    assert rank_seed(5, 3) == rank_seed(5, 3) != rank_seed(6, 3)


def test_shard_env_slices_the_batch_and_rejects_an_uneven_split(device):
    env = _env(device=device)
    env.reset(seed=0)
    local = shard_env(env, 1, 4)
    assert local.num_envs == 2 and env.num_envs == B and local._state is None
    assert local.g == env.g and local._generator is not env._generator
    assert local.reset(seed=1).shape == (2, 3) and local.device == env.device
    with pytest.raises(PolicyConfigError, match=r"num_envs = 8 is not divisible by the world size 3.*\[1, 2, 4, 8\]"):
        shard_env(env, 0, 3)
    assert shard_env(env, 0, 1) is env


def test_process_group_options_are_checked():
    with pytest.raises(PolicyConfigError, match="unknown backend 'mpi'"):
        DataParallel.setup("cpu", backend="mpi")
    with pytest.raises(PolicyConfigError, match="nccl' needs CUDA"):
        DataParallel.setup("cpu", backend="nccl")
    with pytest.raises(PolicyConfigError, match="timeout_s must be"):
        DataParallel.setup("cpu", timeout_s=0)
    with pytest.raises(PolicyConfigError, match="distributed must be"):
        DataParallel.setup("cpu", distributed="yes")
    single = DataParallel.setup("cpu")
    assert single.world_size == 1 and not single.active and single.is_main


def test_a_group_made_by_setup_is_closed_at_exit_and_not_held(monkeypatch):
    """The group ``setup`` creates gets an exit hook that destroys it while the
    interpreter is whole, and ``DataParallel`` keeps no reference to it (a
    gloo group freed during interpreter shutdown aborts the process)."""
    import atexit

    import torch.distributed as dist

    assert not dist.is_initialized()
    hooks = []
    monkeypatch.setattr(atexit, "register", lambda fn, *a, **k: hooks.append((fn, a, k)))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    try:
        dp = DataParallel.setup("cpu", distributed=True, backend="gloo", timeout_s=30)
        assert dist.is_initialized() and dp.backend == "gloo"
        assert not [v for v in vars(dp).values() if isinstance(v, dist.ProcessGroup)]
        assert len(hooks) == 1
        fn, args, kwargs = hooks[0]
        fn(*args, **kwargs)
        assert not dist.is_initialized()
        fn(*args, **kwargs)  # a second call (the script destroyed it itself) is harmless
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_distributed_true_without_a_launcher_names_what_is_missing(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(PolicyConfigError, match="needs the environment variable RANK"):
        train_policy(_env(), updates=1, distributed=True, **SETTINGS)


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch, device):
    path = tmp_path / "c.pt"
    trainer = PolicyTrainer(_env(device=device), distributed=False, **SETTINGS)
    trainer.save(path)
    before = path.read_bytes()
    real_save = torch.save

    def crash_half_way(obj, f, *args, **kwargs):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt_mod.torch, "save", crash_half_way)
    trainer.train(1)
    with pytest.raises(OSError, match="disk full"):
        trainer.save(path)
    monkeypatch.setattr(ckpt_mod.torch, "save", real_save)
    assert path.read_bytes() == before  # the old checkpoint, whole
    assert sorted(os.listdir(tmp_path)) == ["c.pt"]  # no temporary file left behind
    assert PolicyTrainer(_env(device=device), distributed=False, **SETTINGS).load(path).updates_done == 0
    trainer.save(path)
    assert PolicyTrainer(_env(device=device), distributed=False, **SETTINGS).load(path).updates_done == 1
    if os.name == "posix":  # the permissions of an ordinary new file, not mkstemp's private 0600
        assert path.stat().st_mode & 0o777 == 0o666 & ~ckpt_mod._UMASK


def test_one_process_training_on_the_test_device(device):
    """The trainer keeps everything on the env's device (``make test-cuda`` runs this on CUDA)."""
    env = Pendulum(B, y_init=2.0, max_episode_steps=EPISODE, device=device)
    t = train_policy(env, updates=2, **SETTINGS)
    assert {p.device for p in t.policy.parameters()} == {env.device}
    assert t.policy.normalizer.mean.device == env.device
    assert math.isfinite(t.history[-1]["actor_loss"])


# ------------------------------------------------------------ real torchrun
# The same training as the spawned tests, but started by the launcher users
# run: `python -m torch.distributed.run --standalone --nproc_per_node 2 <this
# file> --torchrun-job OUT`. Each worker records every file it opens for
# writing or renames (a sys.addaudithook: it sees open, os.open and
# os.replace, whoever calls them), so the test can tell which rank wrote the
# log and the checkpoint.
TORCHRUN_DEADLINE_S = 120  # the launcher and both workers are killed after this
TORCHRUN_UPDATES = 3


def _torchrun_job(out_dir: str):
    import sys

    rank = int(os.environ["RANK"])
    writes: list[tuple[str, str]] = []
    out_dir = os.path.realpath(out_dir)

    def audit(event, args):
        if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            path, mode, flags = (list(args) + [None, None])[:3]
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
            if writing:
                writes.append(("open", os.fsdecode(path)))
        elif event == "os.rename" and args:
            writes.append(("rename", os.fsdecode(args[1])))

    sys.addaudithook(audit)
    torch.set_num_threads(1)
    threads_before = _threads()

    def at_exit():  # registered first, so it runs after the exit hook train_policy registers
        with open(os.path.join(out_dir, f"result{rank}_exit.txt"), "w") as f:
            f.write(f"{threads_before} {_threads()}")

    atexit.register(at_exit)
    t = train_policy(_env(), updates=TORCHRUN_UPDATES, checkpoint=os.path.join(out_dir, "run.pt"),
                     checkpoint_every=TORCHRUN_UPDATES, log_csv=os.path.join(out_dir, "run.csv"),
                     timeout_s=60, progress=False, **SETTINGS)
    result = {"rank": rank, "world": t.data_parallel.world_size, "local_envs": t.env.num_envs,
              "holds_group": [k for k, v in vars(t.data_parallel).items()
                              if isinstance(v, torch.distributed.ProcessGroup)],
              "params": _flat(t), "history": t.history,
              "writes": [(kind, os.path.basename(p)) for kind, p in writes
                         if os.path.dirname(os.path.realpath(p)) == out_dir]}
    torch.save(result, os.path.join(out_dir, f"result{rank}.pt"))  # after the list was taken: not in it
    # No destroy_process_group(): the script ends as docs/scaling.md's does,
    # and the trainer lives until the interpreter exits. The group that
    # train_policy created is closed by its exit hook while the interpreter
    # is whole, and nothing else may hold it: a gloo group whose threads run
    # on into interpreter shutdown aborts the process now and then, which
    # fails this test's return-code check only by chance, so at_exit counts
    # the threads left once the group is closed (gloo's are joined then).
    return t


def _threads() -> int:
    """The number of threads this process runs (Linux: /proc/self/task)."""
    return len(os.listdir("/proc/self/task"))


@pytest.mark.slow
def test_torchrun_two_processes_match_one_process(tmp_path):
    run_torchrun(__file__, ["--torchrun-job", str(tmp_path)], tmp_path, deadline_s=TORCHRUN_DEADLINE_S)
    r0, r1 = (torch.load(tmp_path / f"result{r}.pt", weights_only=False) for r in range(2))
    assert (r0["rank"], r1["rank"]) == (0, 1)
    assert r0["holds_group"] == r1["holds_group"] == []  # the trainer holds no reference to the group
    assert r0["world"] == r1["world"] == 2 and r0["local_envs"] == r1["local_envs"] == B // 2
    # The 2-process run is the 1-process run with the whole batch (the same data).
    assert torch.equal(r0["params"], r1["params"])
    torch.testing.assert_close(r0["params"], _flat(_reference(TORCHRUN_UPDATES)), rtol=1e-9, atol=1e-10)
    want = [row["actor_loss"] for row in _reference(TORCHRUN_UPDATES).history]
    assert [row["actor_loss"] for row in r1["history"]] == pytest.approx(want, rel=1e-9, abs=1e-12)
    # Rank 0 alone wrote the log and the checkpoint (through a temporary file renamed over it).
    assert r1["writes"] == []
    assert ("open", "run.csv") in r0["writes"] and ("rename", "run.pt") in r0["writes"]
    assert sorted(p for p in os.listdir(tmp_path) if not p.startswith("result")) == ["run.csv", "run.pt"]
    # Once the exit hook closed the group, gloo's threads are gone: nothing
    # (a torch module's default argument, the trainer) kept the group alive.
    for r in range(2):
        before, at_exit = map(int, (tmp_path / f"result{r}_exit.txt").read_text().split())
        assert at_exit == before, f"rank {r}: {at_exit} threads at exit after the group was closed, {before} before it"
    with open(tmp_path / "run.csv") as f:
        assert [int(r["update"]) for r in csv.DictReader(f)] == list(range(1, TORCHRUN_UPDATES + 1))
    assert ckpt_mod.read_checkpoint(tmp_path / "run.pt")["world_size"] == 2


if __name__ == "__main__":  # a worker of test_torchrun_two_processes_match_one_process
    import sys

    if len(sys.argv) == 3 and sys.argv[1] == "--torchrun-job":
        _trainer = _torchrun_job(sys.argv[2])
