"""Simulate a large batch of quadrupeds on every CPU core: one process per
core, each stepping its share of the batch.

    python examples/rollout_processes.py --batch 256                  # one process
    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 \\
        examples/rollout_processes.py --batch 4096                    # two processes

Every process builds the same start states (the shipped quadruped dropped
from 2 cm with random joint velocities, one seed for the whole batch) and
simulates robots ``rank * B / N`` to ``(rank + 1) * B / N`` with contact,
without gradient; rank 0 gathers the final states and prints the throughput.
The final states do not depend on the number of processes (each robot is
simulated on its own; only the batch's kernels differ, so they agree to
rounding). On a CPU this is how backdrive uses several cores for plain
rollouts: a step is about 2,000 small tensor operations, which torch's
threads inside one process barely speed up (``docs/contact.md``, *Speed*).
Training scales the same way through ``train_policy`` (``docs/scaling.md``).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist

from backdrive.contact import ContactGeometry, ContactModel
from backdrive.data import load
from backdrive.kinematics import forward_kinematics
from backdrive.runtime import retain_freed_memory
from backdrive.sim import PDActuator, Simulator, State

STAND = (0.0, 0.7, -1.4)


def build(dtype: torch.dtype = torch.float64) -> Simulator:
    """The shipped quadruped on a floor under PD servos, 10 ms steps."""
    robot = load("quadruped", floating_base=True, dtype=dtype)
    feet = [n for n in robot.link_names if n.endswith("_foot")]
    contact = ContactModel(robot, ContactGeometry.from_model(robot, links=feet))
    return Simulator(robot, 1e-2, actuator=PDActuator(kp=80.0, kd=2.0), contact=contact)


def start_states(sim: Simulator, batch: int, seed: int = 0) -> State:
    """The whole batch's start states (the same on every process): standing
    pose, feet 2 cm above the floor, joint velocities ~ N(0, 0.5 rad/s)."""
    robot = sim.robot
    q0 = robot.neutral()
    q0[7:] = torch.tensor(STAND * 4, dtype=robot.dtype)
    T = forward_kinematics(robot, q0)
    feet = [n for n in robot.link_names if n.endswith("_foot")]
    q0[2] = -min(float(T[robot.frame_index(f), 2, 3]) for f in feet) + 0.02 + 0.02
    g = torch.Generator().manual_seed(seed)
    v = torch.zeros(batch, robot.nv, dtype=robot.dtype)
    v[:, 6:] = 0.5 * torch.randn(batch, robot.nv - 6, generator=g, dtype=robot.dtype)
    return State(q0.expand(batch, -1).clone(), v)


def simulate(sim: Simulator, batch: int, steps: int, rank: int = 0, world: int = 1):
    """This process's share of the batch: final ``(q, v)`` and wall seconds."""
    if batch % world:
        raise ValueError(f"--batch {batch} does not split into {world} processes")
    share = batch // world
    s = start_states(sim, batch)
    mine = State(s.q[rank * share:(rank + 1) * share], s.v[rank * share:(rank + 1) * share])
    targets = torch.tensor(STAND * 4, dtype=sim.robot.dtype).expand(share, steps, 12)
    with torch.no_grad():
        t = time.perf_counter()
        traj = sim.rollout(mine, targets, contact_record=False)
        seconds = time.perf_counter() - t
    return traj.q[:, -1], traj.v[:, -1], seconds


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1024, help="robots in the whole batch (all processes)")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    ap.add_argument("--out", default=None, help="write the gathered final states here (torch.save), rank 0")
    args = ap.parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    torch.set_num_threads(1)
    retain_freed_memory()  # large batches: reuse freed memory instead of page-faulting it back in
    sim = build(getattr(torch, args.dtype))
    simulate(sim, 2 * world, 2)  # warm-up: the model's caches
    if world > 1:
        dist.barrier()
    t0 = time.perf_counter()
    q, v, _ = simulate(sim, args.batch, args.steps, rank, world)
    if world > 1:
        qs, vs = [torch.empty_like(q) for _ in range(world)], [torch.empty_like(v) for _ in range(world)]
        dist.all_gather(qs, q)
        dist.all_gather(vs, v)
        q, v = torch.cat(qs), torch.cat(vs)
    wall = time.perf_counter() - t0
    result = {"q": q, "v": v, "world": world, "wall_s": wall}
    if rank == 0:
        robot_s = args.batch * args.steps * sim.dt
        print(f"{args.batch} quadrupeds x {args.steps} steps of {sim.dt * 1e3:g} ms on {world} process(es): "
              f"{wall:.2f} s, {robot_s / wall:,.0f} robot-seconds per second; "
              f"base height {float(q[:, 2].min()):.4f}-{float(q[:, 2].max()):.4f} m")
        if args.out:
            torch.save(result, args.out)
    if world > 1:
        dist.destroy_process_group()
    return result


if __name__ == "__main__":
    main()
