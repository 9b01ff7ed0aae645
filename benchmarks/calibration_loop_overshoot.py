"""Why does fine-tuning the shipped Go1 walker with SHAC speed it up? (issue 13, 11th session)

In the nominal simulator of ``calibration_loop.py`` (or a calibrated one, ``--calibration``) (the fine-tuning recipe of
``calibration_loop.fine_tune_policy``: the shipped actor, its observation
statistics frozen, a fresh critic fitted alone for ``--warmup`` updates):

1. **Critic slope**: after the warm-up, the critic's derivative with respect
   to the base forward speed in its input (the privileged observation), at
   the states of a window, by command bin, against the true reward's slope
   (the tracking term ``exp(-(vx - cmd)^2 / 0.25)``'s derivative). A critic
   that rises with the speed where the walk already meets the command pushes
   the actor faster.
2. **Gradient decomposition**: on one window, the actor objective's gradient
   split into each reward term and the critic's terminal value (and by
   command bin), each projected on the gradient of the window's mean forward
   speed: which part of the objective asks for more speed, and the speed
   change one Adam step of ``--lr`` along the whole gradient predicts.
3. **Branches** from the same warmed-up critic: ``--actor-updates`` actor
   steps at ``--lr`` with (a) the recipe as it is, (b) every command at 0.5
   m/s (the deployment's), (c) no exploration noise; the policy's speed in
   the same sim every ``--every`` actor updates (8 episodes x 6 s at 0.5
   m/s, seed 123: ``calibration_loop.SELECT``).

    python benchmarks/calibration_loop_overshoot.py --out outputs/benchmarks/overshoot_go1.json

``--profile [PT ...]`` only measures the forward speed per second of the
shipped policy (and of saved fine-tunings) in the sim: whether the speed
drifts within an episode.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration_loop as CL  # noqa: E402
import locomotion_transfer as LT  # noqa: E402

from backdrive.envs import QuadrupedWalk  # noqa: E402
from backdrive.optim import PolicyTrainer  # noqa: E402
from backdrive.optim._policy.returns import window_objective  # noqa: E402

VX = 47  # the base forward speed's index in the privileged observation (after 47 proprioceptive entries)
CMD = 42  # the forward command's index in the observation
BINS = ((0.2, 0.4), (0.4, 0.6), (0.6, 0.8))


def log(*a):
    print(*a, flush=True)


def speed_eval(policy, env):
    m = env.evaluate(policy.eval(), LT.COMMAND, seconds=CL.SELECT["seconds"], seed=CL.SELECT["seed"],
                     settle=LT.SETTLE)
    policy.train()
    return {"forward_speed": float(m["forward_speed"]), "speed_error": float(m["speed_error"]),
            "upright": float(m["upright"])}


def critic_slope(trainer):
    """dV/dvx of the critic at the states of one (detached) window, and the tracking term's slope there."""
    env = trainer.env
    with torch.no_grad():
        roll = trainer._rollout()
    obs = roll["final_obs"].detach().reshape(-1, env.obs_dim).clone().requires_grad_(True)
    v = trainer.critic(trainer._normalizer()(obs))
    (g,) = torch.autograd.grad(v.sum(), obs)
    vx, cmd = obs[:, VX].detach(), obs[:, CMD].detach()
    track = -8.0 * (vx - cmd) * torch.exp(-((vx - cmd) ** 2) / 0.25)  # d/dvx exp(-(vx - cmd)^2 / 0.25)
    out = {}
    for lo, hi in BINS:
        m = (cmd >= lo) & (cmd < hi + 1e-9)
        if m.any():
            out[f"{lo}-{hi}"] = {"n": int(m.sum()), "vx_minus_cmd": float((vx - cmd)[m].mean()),
                                 "dV_dvx": float(g[m, VX].mean()), "dr_track_dvx": float(track[m].mean())}
    m = ((vx - cmd).abs() < 0.05)
    out["|vx-cmd|<0.05"] = {"n": int(m.sum()), "dV_dvx": float(g[m, VX].mean()) if m.any() else float("nan"),
                            "dr_track_dvx": float(track[m].mean()) if m.any() else float("nan")}
    return out


def decompose(trainer, lr):
    """Each objective part's gradient projected on the gradient of the window's mean forward speed."""
    env, c = trainer.env, trainer.config
    terms_log = []
    inner = env.reward

    def reward(state, action, next_state):
        t = env.reward_terms(state, action, next_state)
        terms_log.append({k: env.reward_weights[k] * x for k, x in t.items()})
        return sum(terms_log[-1].values())

    env.reward = reward
    try:
        roll = trainer._rollout()
    finally:
        env.reward = inner
    N, H = env.num_envs, c.horizon
    done, term = roll["done"], roll["terminated"]
    value = trainer.target_critic(trainer._normalizer()(roll["final_obs"])) * (~term)
    cmd = roll["obs"][0, :, CMD]
    params = [p for p in trainer.policy.parameters()]

    def grad(x):
        gs = torch.autograd.grad(x, params, retain_graph=True, allow_unused=True)
        return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(gs, params)])

    speed = roll["final_obs"][:, :, VX].mean()
    gS = grad(speed)
    parts = {}
    for k in terms_log[0]:
        r = torch.stack([t[k] for t in terms_log])
        parts[k] = window_objective(r, done, c.gamma, None).sum() / (N * H)
    total_r = torch.stack([sum(t.values()) for t in terms_log])
    full = window_objective(total_r, done, c.gamma, value).sum() / (N * H)
    parts["critic value"] = full - window_objective(total_r, done, c.gamma, None).sum() / (N * H)
    for lo, hi in BINS:
        m = ((cmd >= lo) & (cmd < hi + 1e-9)).to(total_r.dtype)
        parts[f"tracking_lin, cmd {lo}-{hi}"] = (window_objective(torch.stack([t["tracking_lin"] for t in terms_log]),
                                                                  done, c.gamma, None) * m).sum() / (N * H)
        parts[f"critic value, cmd {lo}-{hi}"] = ((window_objective(total_r, done, c.gamma, value)
                                                  - window_objective(total_r, done, c.gamma, None)) * m).sum() / (N * H)
    parts["total"] = full
    nS = gS.norm()
    out = {"window_mean_speed": float(speed), "speed_grad_norm": float(nS)}
    gtot = None
    for k, x in parts.items():
        g = grad(x)
        if k == "total":
            gtot = g
        out[k] = {"objective": float(x), "grad_norm": float(g.norm()), "along_speed": float(g @ gS / nS),
                  "cosine": float(g @ gS / (nS * g.norm() + 1e-30))}
    # One Adam step from fresh moments: lr * sign(g) per weight (after clipping, sign is unchanged).
    out["adam_step_predicted_speed_change"] = float(lr * torch.sign(gtot) @ gS)
    return out


def speed_profile(paths, params, seconds: float = 10.0, episodes: int = 8, seed: int = 123) -> dict:
    """Forward speed per second (along each robot's heading, from the base
    positions) of the shipped policy and of the policies in ``paths``
    (state dicts) in the sim of ``params``, under the 0.5 m/s command."""
    from backdrive.spatial import quat_apply

    _, shipped = QuadrupedWalk.pretrained(1, robot="go1")
    out = {}
    for name in ["shipped", *paths]:
        pol = shipped
        if name != "shipped":
            pol = copy.deepcopy(shipped)
            pol.load_state_dict(torch.load(name, weights_only=True))
            pol.eval()
        env = CL.make_env(params, episodes, robot_name="go1")
        m = env.evaluate(pol, LT.COMMAND, seconds=seconds, seed=seed, settle=LT.SETTLE)
        q = m["q"].double()
        h = quat_apply(q[:-1, :, 3:7], q.new_tensor([1.0, 0.0, 0.0]).expand(q.shape[0] - 1, q.shape[1], 3))
        v = ((q[1:, :, :3] - q[:-1, :, :3]) * h).sum(-1) / env.dt  # (T, N)
        per_s = v.reshape(int(round(seconds)), -1, v.shape[1]).mean((1, 2)).tolist()
        out[name] = {"per_second": per_s, "forward_speed": m["forward_speed"], "upright": m["upright"]}
        log(name, json.dumps(out[name]))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--actor-updates", type=int, default=10)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--envs", type=int, default=64, help="training copies (GO1_WALK_SHAC's 64)")
    ap.add_argument("--branches", default="recipe,cmd0.5,noise0")
    ap.add_argument("--out", default="outputs/benchmarks/overshoot_go1.json")
    ap.add_argument("--calibration", default=None, metavar="JSON",
                    help="train in this calibration's sim (calibration_loop.py --calibrate-only's JSON) instead of "
                         "the nominal one")
    ap.add_argument("--no-diagnose", action="store_true", help="skip the critic slope and gradient decomposition")
    ap.add_argument("--save-policies", default=None, metavar="PREFIX",
                    help="save each branch's best own-sim candidate (the shipped one included) as PREFIX_<branch>.pt "
                         "(+ .json), calibration_loop.py --nominal-only's format")
    ap.add_argument("--save-candidates", action="store_true",
                    help="with --save-policies: also save every evaluated candidate as PREFIX_<branch>_uK.pt (+ .json, "
                         "kept = K), K = --every, 2 --every, ...: for deploying the policies the selection passed over")
    ap.add_argument("--profile", nargs="*", default=None, metavar="PT",
                    help="only the forward speed per second of the shipped policy and these state dicts "
                         "(8 x --profile-seconds at 0.5 m/s, seed 123) in the sim, written to --out")
    ap.add_argument("--profile-seconds", type=float, default=10.0)
    ap.add_argument("--resume-warm", action="store_true",
                    help="take the shipped policy's own-sim speed and the warmed-up critic from an earlier run's --out "
                         "JSON and its .warm.pt (same arguments) instead of redoing them: the branches start from "
                         "the same state")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*torch.jit.script.*")
    res = {"args": vars(args)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.profile is not None:
        params = json.loads(Path(args.calibration).read_text())["calibrated"] if args.calibration else None
        res["profile"] = speed_profile(args.profile, params, seconds=args.profile_seconds)
        out.write_text(json.dumps(res, indent=1))
        return

    def save():
        out.write_text(json.dumps(res, indent=1))

    _, shipped = QuadrupedWalk.pretrained(1, robot="go1")
    params = json.loads(Path(args.calibration).read_text())["calibrated"] if args.calibration else None
    env = CL.make_env(params, args.envs, robot_name="go1")
    ev = CL.make_env(params, CL.SELECT["episodes"], robot_name="go1")
    config = dataclasses.replace(CL.GO1_WALK_SHAC.config, lr=args.lr, seed=args.seed, normalize_obs=False,
                                 lr_decay_updates=None)
    t0 = time.perf_counter()
    ckpt = out.with_suffix(".warm.pt")
    if args.resume_warm:
        prev = json.loads(out.read_text())
        if {k: v for k, v in prev["args"].items() if k != "resume_warm"} != {
                k: v for k, v in vars(args).items() if k != "resume_warm"}:
            raise SystemExit(f"{out} was written with other arguments")
        res["shipped"], res["critic_loss"], res["resumed_from_warm"] = prev["shipped"], prev["critic_loss"], True
        log("resumed after the warm-up:", res["shipped"])
    else:
        trainer = PolicyTrainer(env, config=config, policy=copy.deepcopy(shipped).train())
        for g in trainer.actor_opt.param_groups:
            g["lr"] = 0.0
        res["shipped"] = speed_eval(trainer.policy, ev)
        log("shipped, own (nominal) sim:", res["shipped"], f"{time.perf_counter() - t0:.0f} s")
        res["critic_loss"] = []
        for k in range(args.warmup):
            res["critic_loss"].append(trainer.update()["critic_loss"])
        log(f"warm-up {args.warmup} critic-only updates in {time.perf_counter() - t0:.0f} s, critic loss "
            f"{res['critic_loss'][0]:.3g} -> {res['critic_loss'][-1]:.3g}")
        # The branches start from this state: the "recipe" branch is then exactly
        # calibration_loop.fine_tune_policy(updates=warmup + actor_updates,
        # select every `every`) in the nominal sim (same seed, windows and noise).
        trainer.save(ckpt)

    def warm():
        tr = PolicyTrainer(CL.make_env(params, args.envs, robot_name="go1"), config=config,
                           policy=copy.deepcopy(shipped).train())
        return tr.load(ckpt)

    if not args.no_diagnose and not args.resume_warm:
        diag = warm()
        res["critic_slope"] = critic_slope(diag)
        log("critic slope:", json.dumps(res["critic_slope"]))
        res["decomposition"] = decompose(diag, args.lr)
        log("decomposition:", json.dumps(res["decomposition"], indent=1))
        del diag
    save()
    res["branches"] = {}
    for name in args.branches.split(","):
        tr = warm()
        if name == "cmd0.5":
            e = tr.env
            e._cmd_low = e._cmd_low.clone()
            e._cmd_high = e._cmd_high.clone()
            e._cmd_low[0] = e._cmd_high[0] = 0.5
            e.command_ranges = {**e.command_ranges, "vx": (0.5, 0.5)}
            e.set_command(torch.tensor([0.5, 0.0, 0.0]))
        elif name == "noise0":
            tr.config = dataclasses.replace(tr.config, action_noise=0.0)
        elif name != "recipe":
            raise SystemExit(f"unknown branch {name}")
        tr.actor_opt = torch.optim.Adam(tr.policy.parameters(), lr=args.lr, betas=tr.config.betas)
        rows = [{"update": 0, **res["shipped"]}]
        best = (res["shipped"]["speed_error"], 0, copy.deepcopy(tr.policy.state_dict()))
        for k in range(1, args.actor_updates + 1):
            h = tr.update()
            if k % args.every == 0:
                row = {"update": k, **speed_eval(tr.policy, ev), "window_reward": h["window_reward"]}
                rows.append(row)
                log(f"  {name}: after {k} actor updates {row}  ({time.perf_counter() - t0:.0f} s)")
                if args.save_policies and args.save_candidates:
                    path = f"{args.save_policies}_{name}_u{k}.pt"
                    torch.save(tr.policy.state_dict(), path)
                    Path(path + ".json").write_text(json.dumps({
                        "robot": "go1", "updates": args.warmup + k, "warmup": args.warmup, "lr": args.lr,
                        "seed": args.seed, "branch": name, "sim": args.calibration or "nominal",
                        "selection": {"kept": k, "candidates": [row], **CL.SELECT},
                        "from": "benchmarks/calibration_loop_overshoot.py --save-candidates"}))
                if row["upright"] == 1.0 and row["speed_error"] < best[0]:
                    best = (row["speed_error"], k, copy.deepcopy(tr.policy.state_dict()))
        res["branches"][name] = rows
        if args.save_policies:
            # calibration_loop.py --nominal-only's format (PATH and PATH.json), for --deploy-only.
            path = f"{args.save_policies}_{name}.pt"
            torch.save(best[2], path)
            Path(path + ".json").write_text(json.dumps({
                "robot": "go1", "updates": args.warmup + args.actor_updates, "warmup": args.warmup, "lr": args.lr,
                "seed": args.seed, "branch": name, "sim": args.calibration or "nominal", "selection": {"kept": best[1], "candidates": rows, **CL.SELECT},
                "from": "benchmarks/calibration_loop_overshoot.py"}))
            log(f"  {name}: kept the policy after {best[1]} actor updates -> {path}")
        save()
    log(f"wrote {out}")


if __name__ == "__main__":
    main()
