"""Train a conditional grasp-yaw predictor through the differentiable IK layer.

Cans stand on a table in front of a Panda whose last joint (the wrist roll,
joint 7) is restricted to ``[1.0, 2.9]`` rad, as a cable routed through the
wrist would demand. A can may be taken from above at any yaw, but the yaw
decides the joints: turned straight towards the can (the usual rule) the hand
needs the wrist below its restricted range, so the IK layer clamps it and the
grasp is missed; turned too far, the arm travels far from its ready posture.
The best yaw depends on where the can stands.

A small network sees the can's position and outputs the grasp yaw. Its loss
is computed *after* inverse kinematics: the yaw makes a top-down target
pose, ``DifferentiableIKLayer`` turns it into joints (16 unrolled DLS
iterations from the ready posture), and the cost is

    |IK position residual|^2 / (5 mm)^2 + |IK rotation residual|^2 / (0.05 rad)^2
    + 0.5 * |q - q_ready|^2 / rad^2                  (joint travel)

so the gradient reaches the network through the IK solve. The network
starts as the heading rule (its output is an offset from the heading, zero
at initialisation). The frozen predictor is then compared on held-out cans
with

* the heading baseline: the hand turned towards the can (yaw = heading from
  the robot base to the can, the hand's yaw at the ready posture being 0), and
* a numerical reference: a grid search over yaw every 2 degrees, each
  candidate solved with the same IK layer.

    python examples/ik_grasp_orientation.py              # about a minute on a laptop CPU
    python examples/ik_grasp_orientation.py --steps 100  # a quick look

The figure goes to ``outputs/examples/ik_grasp_orientation.png``.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
from torch import nn

from backdrive.data import get_data_path
from backdrive.kinematics import DifferentiableIKCfg, SerialChainKinematics
from backdrive.layers import DifferentiableFKLayer, DifferentiableIKLayer

Q_READY = [0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785]
GRASP_HEIGHT = 0.12  # m, tool point above the table plane z = 0
W_TRAVEL = 0.5
WRIST_RANGE = (1.0, 2.9)  # rad, the restricted range of joint 7


def grasp_pose(xy: torch.Tensor, yaw: torch.Tensor) -> torch.Tensor:
    """``(..., 4, 4)`` top-down tool poses: tool z pointing down, turned by ``yaw``."""
    c, s = torch.cos(yaw), torch.sin(yaw)
    z, o = torch.zeros_like(yaw), torch.ones_like(yaw)
    # Rz(yaw) @ diag(1, -1, -1)
    R = torch.stack(
        [torch.stack([c, s, z], -1), torch.stack([s, -c, z], -1), torch.stack([z, z, -o], -1)], -2
    )
    p = torch.cat([xy, torch.full_like(yaw, GRASP_HEIGHT)[..., None]], -1)
    top = torch.cat([R, p[..., None]], -1)
    bottom = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=yaw.dtype).expand(*yaw.shape, 1, 4)
    return torch.cat([top, bottom], -2)


def grasp_cost(ik: DifferentiableIKLayer, q_ready: torch.Tensor, xy: torch.Tensor, yaw: torch.Tensor):
    """Per-can cost of grasping at ``yaw`` (see the module docstring) and the IK result."""
    res = ik.solve(grasp_pose(xy, yaw), q_ready)
    cost = (
        (res.position_error**2).sum(-1) / 0.005**2
        + (res.rotation_error**2).sum(-1) / 0.05**2
        + W_TRAVEL * ((res.qpos - q_ready) ** 2).sum(-1)
    )
    return cost, res


class YawPredictor(nn.Module):
    """Can position ``(x, y)`` -> grasp yaw, as an offset from the heading to the
    can (``(cos, sin)`` turned into an angle; zero offset at initialisation)."""

    def __init__(self, hidden: int = 128):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(4, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, 2)
        )
        nn.init.zeros_(self.net[-1].weight)
        with torch.no_grad():
            self.net[-1].bias.copy_(torch.tensor([1.0, 0.0]))

    def forward(self, xy: torch.Tensor) -> torch.Tensor:
        x, y = xy.unbind(-1)
        heading = torch.atan2(y, x)
        feats = torch.stack([(x - 0.5) / 0.15, y / 0.2, torch.cos(heading), torch.sin(heading)], -1)
        out = self.net(feats)
        return heading + torch.atan2(out[..., 1], out[..., 0])


def sample_cans(n: int, generator: torch.Generator) -> torch.Tensor:
    """``(n, 2)`` can positions on the table."""
    u = torch.rand(n, 2, generator=generator)
    return torch.stack([0.3 + 0.4 * u[:, 0], -0.35 + 0.7 * u[:, 1]], -1)


def wrap(a: torch.Tensor) -> torch.Tensor:
    return torch.remainder(a + math.pi, 2 * math.pi) - math.pi


def heading_baseline(xy: torch.Tensor) -> torch.Tensor:
    """The hand turned towards the can: the heading from the robot base."""
    return torch.atan2(xy[:, 1], xy[:, 0])


@torch.no_grad()
def search_reference(ik, q_ready, xy, step_deg: float = 2.0, chunk: int = 50) -> torch.Tensor:
    """Grid search over the yaw, every ``step_deg`` degrees."""
    grid = torch.arange(-180.0, 180.0, step_deg) * math.pi / 180
    best = []
    for b in xy.split(chunk):
        cand = grid.expand(len(b), -1)  # (n, k)
        k = cand.shape[1]
        cost, _ = grasp_cost(ik, q_ready, b[:, None, :].expand(-1, k, -1), cand)
        best.append(cand[torch.arange(len(b)), cost.argmin(1)])
    return torch.cat(best)


@torch.no_grad()
def evaluate(name, ik, q_ready, xy, yaw) -> dict:
    cost, res = grasp_cost(ik, q_ready, xy, yaw)
    s = {
        "name": name,
        "cost_mean": cost.mean().item(),
        "cost_median": cost.median().item(),
        "success": res.success.float().mean().item(),
        "travel": (res.qpos - q_ready).norm(dim=-1).mean().item(),
        "cost": cost,
    }
    print(
        f"  {name:<22} cost mean {s['cost_mean']:8.2f}  median {s['cost_median']:6.2f}  "
        f"grasp reached (IK success at 1 mm / 0.01 rad) {s['success']:6.1%}  "
        f"mean joint travel {s['travel']:.2f} rad"
    )
    return s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--held-out", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a shared CPU)")
    ap.add_argument("--out", default="outputs/examples/ik_grasp_orientation.png")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)

    chain = SerialChainKinematics.from_urdf(get_data_path("panda"), end_link_name="panda_hand_tcp")
    lower = chain.lower.clone()
    upper = chain.upper.clone()
    lower[6], upper[6] = WRIST_RANGE
    fk = DifferentiableFKLayer(chain, lower=lower, upper=upper)
    ik = DifferentiableIKLayer(fk, DifferentiableIKCfg(max_iterations=16, pos_eps=1e-3, rot_eps=1e-2))
    q_ready = torch.tensor(Q_READY)
    model = YawPredictor()
    held_out = sample_cans(args.held_out, g)

    print("IK grasp orientation: Panda, yaw predictor trained through DifferentiableIKLayer")
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.steps, eta_min=1e-4)
    history = []
    t0 = time.perf_counter()
    for step in range(args.steps):
        xy = sample_cans(args.batch, g)
        cost, _ = grasp_cost(ik, q_ready, xy, model(xy))
        loss = cost.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        history.append(loss.item())
        if step % max(1, args.steps // 8) == 0 or step == args.steps - 1:
            print(f"  step {step:4d}  mean cost {loss.item():9.3f}")
    train_s = time.perf_counter() - t0

    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    with torch.no_grad():
        learned_yaw = model(held_out)
    t1 = time.perf_counter()
    search_yaw = search_reference(ik, q_ready, held_out)
    search_s = time.perf_counter() - t1
    print(f"held-out cans: {len(held_out)}; training {train_s:.1f} s; grid search {search_s:.1f} s")
    results = [
        evaluate("heading baseline", ik, q_ready, held_out, heading_baseline(held_out)),
        evaluate("learned (frozen)", ik, q_ready, held_out, learned_yaw),
        evaluate("grid search reference", ik, q_ready, held_out, search_yaw),
    ]
    gap = (results[1]["cost"] - results[2]["cost"]).clamp_min(0)
    print(
        f"  learned within 1 cost unit of the search optimum on {(gap < 1.0).float().mean().item():.1%} "
        f"of the cans; predictions cost {1e3 * _time_prediction(model, held_out):.2f} ms for all of them "
        f"(search: {search_s:.1f} s)"
    )
    _plot(args.out, history, held_out, learned_yaw, search_yaw, results)
    print(f"figure: {args.out}")
    return 0


def _time_prediction(model, xy) -> float:
    with torch.no_grad():
        model(xy)
        t = time.perf_counter()
        model(xy)
        return time.perf_counter() - t


def _plot(path, history, xy, learned, search, results) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(15, 4.4))
    ax[0].semilogy(history, lw=0.8)
    ax[0].set(title="training: mean grasp cost after IK", xlabel="step", ylabel="cost")
    # grasp yaw relative to the heading, learned vs search, over the table
    heading = torch.atan2(xy[:, 1], xy[:, 0])
    d_l = torch.rad2deg(wrap(learned - heading))
    d_s = torch.rad2deg(wrap(search - heading))
    ax[1].scatter(xy[:, 1], d_s, s=10, alpha=0.7, label="grid search")
    ax[1].scatter(xy[:, 1], d_l, s=6, alpha=0.7, label="learned (frozen)")
    ax[1].axhline(0.0, color="gray", lw=1, label="heading baseline")
    ax[1].set(title="grasp yaw - heading to the can (deg)", xlabel="can y (m)", ylabel="deg")
    ax[1].legend(fontsize=8)
    names = [r["name"] for r in results]
    ax[2].bar(names, [r["cost_mean"] for r in results], color=["tab:gray", "tab:blue", "tab:green"])
    for i, r in enumerate(results):
        ax[2].text(i, r["cost_mean"], f"{r['success']:.0%} reached", ha="center", va="bottom", fontsize=9)
    ax[2].set(title="held-out mean cost (lower is better)", ylabel="cost")
    ax[2].tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
