"""Train a joint predictor through the FK layer with a tool-pose loss.

A small network maps a target tool pose (position and orientation) of the
Panda to its seven joint angles. There is no joint-space supervision: the
loss is the pose error of ``DifferentiableFKLayer(q_pred)`` against the
target, and its gradient reaches the network through the FK layer.

Printed and plotted: the pose error of the initial (untrained) and of the
learned predictor on held-out targets, and on *edited* targets (the held-out
ones moved 4 cm up and turned 20 degrees about the vertical), which no
training sample shows directly.

    python examples/fk_pose_reaching.py            # about 1 minute on a laptop CPU
    python examples/fk_pose_reaching.py --steps 300  # a quick look

The figure goes to ``outputs/examples/fk_pose_reaching.png``.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
from torch import nn

from backdrive.data import get_data_path
from backdrive.kinematics import SerialChainKinematics, pose_error
from backdrive.layers import DifferentiableFKLayer

# Panda's "ready" posture; training targets come from joints within +-SPREAD of it.
Q_READY = [0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785]
SPREAD = 0.45  # rad


def pose_features(T: torch.Tensor) -> torch.Tensor:
    """``(..., 9)``: position and the first two rotation columns (a continuous
    rotation representation)."""
    return torch.cat([T[..., :3, 3], T[..., :3, 0], T[..., :3, 1]], dim=-1)


class JointPredictor(nn.Module):
    """Pose features -> joints, squashed into ``[lower, upper]`` by a sigmoid."""

    def __init__(self, fk: DifferentiableFKLayer, hidden: int = 256):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(9, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, fk.dof)
        )
        q_ready = torch.tensor(Q_READY, dtype=fk.dtype)
        # Predict within the sampled box around the ready posture (a finite
        # range for every joint), starting at its centre.
        self.register_buffer("lo", torch.maximum(q_ready - 1.5 * SPREAD, fk.lower))
        self.register_buffer("hi", torch.minimum(q_ready + 1.5 * SPREAD, fk.upper))
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)
        # feature normalisation from the training distribution, set by fit_normaliser
        self.register_buffer("mu", torch.zeros(9))
        self.register_buffer("sigma", torch.ones(9))

    def fit_normaliser(self, feats: torch.Tensor) -> None:
        self.mu.copy_(feats.mean(0))
        self.sigma.copy_(feats.std(0).clamp_min(1e-3))

    def forward(self, T: torch.Tensor) -> torch.Tensor:
        z = self.net((pose_features(T) - self.mu) / self.sigma)
        return self.lo + (self.hi - self.lo) * torch.sigmoid(z)


def pose_loss(fk: DifferentiableFKLayer, q: torch.Tensor, T: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean of ``|dp|^2 / (1 cm)^2 + |dtheta|^2 / (0.1 rad)^2``, and the per-sample errors."""
    dp, dr = pose_error(fk(q), T)
    pos, rot = dp.norm(dim=-1), dr.norm(dim=-1)
    loss = ((dp**2).sum(-1) / 0.01**2 + (dr**2).sum(-1) / 0.1**2).mean()
    return loss, pos, rot


def sample_targets(fk, n, generator):
    q = torch.tensor(Q_READY) + SPREAD * (2 * torch.rand(n, 7, generator=generator) - 1)
    q = torch.minimum(torch.maximum(q, fk.lower), fk.upper)
    with torch.no_grad():
        return fk(q)


def edit(T: torch.Tensor, dz: float = 0.04, yaw_deg: float = 20.0) -> torch.Tensor:
    """Move targets ``dz`` up and turn them ``yaw_deg`` about the world vertical
    through their own position."""
    yaw = math.radians(yaw_deg)
    Rz = torch.tensor([[math.cos(yaw), -math.sin(yaw), 0.0], [math.sin(yaw), math.cos(yaw), 0.0], [0.0, 0.0, 1.0]])
    out = T.clone()
    out[..., :3, :3] = Rz @ T[..., :3, :3]
    out[..., 2, 3] += dz
    return out


def summarize(name, pos, rot) -> dict:
    s = {
        "case": name,
        "pos_mm_median": 1e3 * pos.median().item(),
        "pos_mm_p90": 1e3 * pos.quantile(0.9).item(),
        "rot_deg_median": math.degrees(rot.median().item()),
        "within_1cm_5deg": ((pos < 0.01) & (rot < math.radians(5))).float().mean().item(),
    }
    print(
        f"  {name:<28} position error median {s['pos_mm_median']:7.1f} mm (p90 {s['pos_mm_p90']:7.1f}), "
        f"rotation median {s['rot_deg_median']:6.2f} deg, within 1 cm & 5 deg: {s['within_1cm_5deg']:6.1%}"
    )
    return s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="outputs/examples/fk_pose_reaching.png")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a shared CPU)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)

    chain = SerialChainKinematics.from_urdf(get_data_path("panda"), end_link_name="panda_hand_tcp")
    fk = DifferentiableFKLayer(chain)
    model = JointPredictor(fk)
    train = sample_targets(fk, 20_000, g)
    held_out = sample_targets(fk, 2_000, g)
    edited = edit(held_out)
    model.fit_normaliser(pose_features(train))

    print("FK pose reaching: Panda, joint predictor trained through DifferentiableFKLayer")
    print("before training:")
    with torch.no_grad():
        before = [summarize(n, *pose_loss(fk, model(T), T)[1:]) for n, T in (("held-out", held_out), ("edited", edited))]

    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.steps, eta_min=5e-5)
    history = []
    t0 = time.perf_counter()
    for step in range(args.steps):
        idx = torch.randint(0, train.shape[0], (args.batch,), generator=g)
        T = train[idx]
        loss, _, _ = pose_loss(fk, model(T), T)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        history.append(loss.item())
        if step % max(1, args.steps // 6) == 0 or step == args.steps - 1:
            print(f"  step {step:5d}  loss {loss.item():10.4f}")
    train_s = time.perf_counter() - t0

    print(f"after training ({args.steps} steps, {train_s:.1f} s):")
    model.eval()
    with torch.no_grad():
        res = {}
        for n, T in (("held-out", held_out), ("edited", edited)):
            _, pos, rot = pose_loss(fk, model(T), T)
            res[n] = (pos, rot)
        after = [summarize(n, *res[n]) for n in ("held-out", "edited")]
        _, pos0, _ = pose_loss(fk, JointPredictor(fk)(held_out), held_out)

    _plot(args.out, history, pos0, res, before, after)
    print(f"figure: {args.out}")
    return 0


def _plot(path, history, pos0, res, before, after) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    ax[0].semilogy(history, lw=0.8)
    ax[0].set(title="training loss (pose error through FK)", xlabel="step", ylabel="loss")
    bins = torch.logspace(-4, 0, 60).numpy()
    ax[1].hist(pos0.numpy(), bins=bins, alpha=0.6, label="initial, held-out")
    ax[1].hist(res["held-out"][0].numpy(), bins=bins, alpha=0.6, label="learned, held-out")
    ax[1].hist(res["edited"][0].numpy(), bins=bins, alpha=0.6, label="learned, edited targets")
    ax[1].set(xscale="log", title="tool position error", xlabel="m", ylabel="targets")
    ax[1].legend()
    names = ["held-out", "edited"]
    x = range(len(names))
    ax[2].bar([i - 0.2 for i in x], [b["within_1cm_5deg"] for b in before], 0.4, label="initial")
    ax[2].bar([i + 0.2 for i in x], [a["within_1cm_5deg"] for a in after], 0.4, label="learned")
    for i in x:
        ax[2].text(i - 0.2, before[i]["within_1cm_5deg"] + 0.01, f"{before[i]['within_1cm_5deg']:.0%}", ha="center")
        ax[2].text(i + 0.2, after[i]["within_1cm_5deg"] + 0.01, f"{after[i]['within_1cm_5deg']:.0%}", ha="center")
    ax[2].set_xticks(list(x), names)
    ax[2].set(title="share within 1 cm and 5 deg", ylim=(0, 1.08))
    ax[2].legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
