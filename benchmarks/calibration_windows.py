"""Which calibration windows can have their start estimated: a diagnostic at the TRUE parameters.

For the MuJoCo calibration benchmark (benchmarks/calibration.py, ``--law
soft --contact hidden``), every window's start offset is fitted through
rolled-out steps with every parameter held at its true value (the
centring that ``ContactFit(estimate_starts='linear')`` runs, the same
per-window Levenberg-Marquardt, from the recorded noisy start, with the
noise prior), and its loss compared with the loss from the exact start
(what MuJoCo really started from). A window whose fitted start stays
more than 4 chi-square standard deviations (``4 sqrt(2 m)``) above the
exact start's loss cannot be used by any fit that estimates its start
locally: nothing about the parameters is wrong there. Reported per
window: the losses, the largest offset in noise levels, and the contact
switches (a foot entering or leaving the floor) of the rollout from the
exact start, and of the starting guess's rollout from the recorded start
summed over the candidate delays 0-4 (what ``ContactFit.select_windows``
ranks by).

``--pool N`` draws N windows and keeps the ``--windows`` whose starting
guess switches contact least (as ``--windows N --select-windows W`` in
benchmarks/calibration.py); without it the windows are drawn as that
benchmark draws them.

Run (minutes on one core):

    python benchmarks/calibration_windows.py --seed 2 [--pool 126]
"""
from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _mujoco_contact as MC  # noqa: E402
import calibration as CAL  # noqa: E402
from backdrive.data import load  # noqa: E402
from backdrive.dynamics import difference, integrate  # noqa: E402
from backdrive.optim import BlockJacobian  # noqa: E402
from backdrive.optim._sysid_contact import _channels, _fit_windows, _start_noise, _window_losses  # noqa: E402
from backdrive.sim import State  # noqa: E402

F64 = torch.float64
OBSERVE = ("joint_position", "joint_velocity", "base_orientation", "base_angular_velocity")


def switches(sim, q0, v0, u) -> torch.Tensor:
    """(windows,) contact switches of each window's rollout."""
    with torch.no_grad():
        inside = sim.rollout(State(q0, v0), u, check_finite=False,
                             contact_record=("penetration",)).contact.penetration > 0
    return (inside[:, 1:] != inside[:, :-1]).flatten(1).sum(1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--segment", type=int, default=50)
    ap.add_argument("--windows", type=int, default=32)
    ap.add_argument("--pool", type=int, default=None, metavar="N",
                    help="draw N windows, keep the --windows whose starting guess switches contact least")
    ap.add_argument("--iterations", type=int, default=12, help="Levenberg-Marquardt iterations of each start")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*torch.jit.script.*")
    K = args.segment

    # The benchmark's data, as benchmarks/calibration.py makes them.
    robot0 = load(MC.ROBOTS["quadruped"].name, floating_base=True)
    model, truth = CAL.reality("quadruped", args.seed, "hidden")
    perm = MC.joint_permutation(model, robot0.joint_names)
    truth["mass"] = np.array([model.body_mass[model.body(name).id] for name in robot0.body_names])
    truth["damping"] = truth["damping"][perm]
    q, v, cmd, push = CAL.record(model, "quadruped", robot0, 20.0, args.seed + 1, truth["delay"])[:4]
    Q, V, U, starts = CAL.segments(q, v, cmd, push, K)
    H, pieces = CAL.history(cmd, starts), len(Q)
    drawn = min(args.pool or args.windows, pieces)
    pick = np.linspace(0, len(Q) - 1, drawn).round().astype(int)
    Q, V, U, H = (torch.as_tensor(x[pick], dtype=F64) for x in (Q, V, U, H))
    Qn, Vn = CAL.with_noise(Q, V, args.seed + 10)
    sent = torch.cat([H, U], 1)
    lead = H.shape[1]

    def acting(delay):
        return sent[:, (torch.arange(K) + lead - delay).clamp_min(0)]

    guess = CAL.nominal(robot0, "soft")[1]
    ranked = sum(switches(guess, Qn[:, 0], Vn[:, 0], acting(d)) for d in range(5))
    keep = torch.arange(len(Q))
    if args.pool:
        keep = torch.sort(torch.argsort(ranked, stable=True)[: args.windows]).values
    Q, V, Qn, Vn, sent, ranked = (x[keep] for x in (Q, V, Qn, Vn, sent, ranked))
    W = len(keep)

    sim = CAL.truth_simulator(robot0, truth, law="soft")
    robot, nv = sim.robot, sim.robot.nv
    u = acting(truth["delay"])
    sigma = _start_noise(robot, CAL.START_NOISE)

    def fun(s):
        ds = s.reshape(W, 2 * nv)
        start = State(integrate(robot, Qn[:, 0], ds[:, :nv]), Vn[:, 0] + ds[:, nv:])
        tr = sim.rollout(start, u, check_finite=False)
        r = _channels(robot, OBSERVE, tr.q[:, 1:], tr.v[:, 1:], Qn[:, 1:], Vn[:, 1:], CAL.START_NOISE)
        return torch.cat([ds / sigma, r], 1).reshape(-1)

    def jac(s):
        # Window w's rows depend on its own offset only: one shared
        # perturbation of every window gives each window's block.
        J, r = torch.func.jacfwd(lambda e: (lambda x: (x, x))(fun(s + e.repeat(W))), has_aux=True)(
            s.new_zeros(2 * nv))
        m = r.numel() // W
        return r, BlockJacobian(J.new_zeros(W, m, 0), J.reshape(W, m, 2 * nv), J.new_zeros(0, 0))

    with torch.no_grad():
        exact = torch.cat([difference(robot, Qn[:, 0], Q[:, 0]), V[:, 0] - Vn[:, 0]], 1)
        m = fun(exact.reshape(-1)).numel() // W
        loss_exact = _window_losses(fun(exact.reshape(-1)), W, m)
        loss_recorded = _window_losses(fun(torch.zeros(W * 2 * nv, dtype=F64)), W, m)
    t0 = time.perf_counter()
    fitted = _fit_windows(fun, jac, torch.zeros(W * 2 * nv, dtype=F64), W, args.iterations)
    took = time.perf_counter() - t0
    with torch.no_grad():
        loss_fitted = _window_losses(fun(fitted), W, m)
    exact_switches = switches(sim, Q[:, 0], V[:, 0], u)
    bound = 4 * math.sqrt(2 * (m - 2 * nv))
    failed = (loss_fitted - loss_exact) > bound

    print(f"# start estimation at the true parameters: seed {args.seed}\n")
    print(f"windows of {K} steps: {W}" + (f" of {drawn} drawn evenly from the recording's {pieces}, those whose "
                                          "starting guess switches contact least" if args.pool else
                                          f" drawn evenly from the recording's {pieces}")
          + f"; true delay {truth['delay']}, time constant {truth['timeconst'] * 1e3:.1f} ms, damping ratio "
          f"{truth['dampratio']:.2f}; {args.iterations} Levenberg-Marquardt iterations per start ({took:.0f} s)\n")
    print("| window | loss, exact start | loss, recorded start | loss, fitted start | fitted / exact | "
          "largest offset, noise levels | switches, exact start | switches, guess (delays 0-4) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for w in range(W):
        print(f"| {int(keep[w])}{' (not found)' if failed[w] else ''} | {loss_exact[w]:.0f} | {loss_recorded[w]:.0f} | "
              f"{loss_fitted[w]:.0f} | {loss_fitted[w] / loss_exact[w]:.2f} | "
              f"{float((fitted.reshape(W, -1)[w] / sigma).abs().max()):.1f} | {int(exact_switches[w])} | "
              f"{int(ranked[w])} |")
    med = lambda x: float(x.float().median()) if x.numel() else math.nan  # noqa: E731
    print(f"\nstarts not found (fitted loss above the exact start's by more than 4 sqrt(2 m) = {bound:.0f}): "
          f"{int(failed.sum())} of {W}; median switches from the exact start: not found {med(exact_switches[failed]):g}, "
          f"found {med(exact_switches[~failed]):g}; at the guess: not found {med(ranked[failed]):g}, "
          f"found {med(ranked[~failed]):g}")


if __name__ == "__main__":
    main()
