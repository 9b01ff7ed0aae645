"""Collect the fine-tuning arms of the calibration loop (13th and 14th sessions) into one JSON and a markdown table.

Each arm is a ``calibration_loop_overshoot.py --branches recipe --save-policies DIR/ARM_sS`` run
(``DIR/ARM_sS.json``) and its deployment ``calibration_loop.py --deploy-only --nominal-policy
DIR/ARM_sS_recipe.pt --out DIR/deploy_ARM_sS.json``. Per arm and seed: the own-sim speed after
0, 5, ... actor updates, the kept checkpoint, and in reality the forward speed and the speed-tracking
error; per arm the mean and the spread (max - min) over seeds.

    python benchmarks/calibration_arms_table.py --dir outputs/benchmarks/c4 --out benchmarks/results/go1_calib_arms_13th.json
    python benchmarks/calibration_arms_table.py --dir outputs/benchmarks/c5 --seeds 0,1,2 --out benchmarks/results/go1_calib_arms_14th.json
    python benchmarks/calibration_arms_table.py --dir outputs/benchmarks/c6 --seeds 3,4,5 \
        --merge benchmarks/results/go1_calib_arms_14th.json --out benchmarks/results/go1_calib_arms_15th.json

``--merge`` adds the seeds of earlier runs of this script (their ``--out`` JSON) that ``--dir``
lacks. ``--pair A,B`` (default ``nominal,calibrated``) compares two arms seed by seed over the
seeds both have: the per-seed difference of the errors in reality (A - B), its mean and standard
error, how many seeds B wins (lower error), and the two-sided exact sign test's p-value (ties
dropped). The criterion for "B transfers measurably better" (15th session, fixed before its
seeds ran): sign test p < 0.05 and the mean difference above twice its standard error.
``--criterion ttest`` (17th session, fixed before its seeds ran) states instead the one-sided paired
t-test of the differences (A - B > 0) with p < 0.05 as the criterion; the sign test and the mean
+- standard error are then reported, not used.

    python benchmarks/calibration_arms_table.py --dir outputs/benchmarks/c8 --seeds 0,1,2,3,4,5 --criterion ttest \
        --out benchmarks/results/go1_calib_arms_17th.json

``--candidates`` lists instead every candidate a ``--save-candidates`` run saved and deployed.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def sign_test(wins: int, losses: int) -> float:
    """Two-sided exact sign test: P(a split at least this uneven | each seed a fair coin), ties dropped."""
    n = wins + losses
    if n == 0:
        return 1.0
    k = min(wins, losses)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def t_upper_tail(t: float, df: int) -> float:
    """P(T >= t) for Student's t with integer ``df`` degrees of freedom (the closed-form finite series
    in the angle atan(t / sqrt(df)); exact up to rounding)."""
    if df < 1:
        raise ValueError("df must be at least 1")
    th = math.atan(abs(t) / math.sqrt(df))
    c2 = math.cos(th) ** 2
    if df % 2:  # odd: 2/pi [theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...)]
        s, term = 0.0, math.sin(th) * math.cos(th)
        for k in range(1, (df - 1) // 2 + 1):
            s += term
            term *= c2 * (2 * k) / (2 * k + 1)
        inside = 2 / math.pi * (th + s)  # P(|T| < |t|)
    else:  # even: sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...)
        s, term = 0.0, 1.0
        for k in range(1, df // 2 + 1):
            s += term
            term *= c2 * (2 * k - 1) / (2 * k)
        inside = math.sin(th) * s
    return (1 - inside) / 2 if t >= 0 else (1 + inside) / 2


def paired(a: dict, b: dict) -> dict:
    """Arm ``a`` against arm ``b`` (each ``{seed: {"real_error": ...}}``) over their common seeds."""
    seeds = sorted(set(a) & set(b), key=int)
    d = [a[s]["real_error"] - b[s]["real_error"] for s in seeds]
    n = len(d)
    mean = sum(d) / n if n else float("nan")
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1)) if n > 1 else float("nan")
    se = sd / math.sqrt(n) if n > 1 else float("nan")
    wins, losses = sum(x > 0 for x in d), sum(x < 0 for x in d)
    p = sign_test(wins, losses)
    # Undefined (None) when every difference is the same, e.g. all zero: both arms deployed one policy.
    t = mean / se if n > 1 and se > 0 else None
    pt = t_upper_tail(t, n - 1) if t is not None else None
    return {"seeds": seeds, "difference": dict(zip(seeds, d)), "mean": mean, "sd": sd, "se": se,
            "b_wins": wins, "b_losses": losses, "ties": n - wins - losses, "sign_test_p": p,
            "t": t, "df": n - 1, "t_test_p_one_sided": pt,
            "measurably_better": bool(n > 1 and p < 0.05 and mean > 2 * se),
            "t_test_met": bool(pt is not None and pt < 0.05)}


def candidates(d: Path, arms: list[str], seeds: list[str]) -> dict:
    """Every saved candidate (``calibration_loop_overshoot.py --save-candidates``, deployed as
    ``DIR/deploy_ARM_sS_uK.json``): its own-sim speed, its speed and error in reality, and the difference."""
    out = {}
    print("| arm | seed | actor updates | own sim (m/s) | in reality: speed (error), m/s | reality minus own sim |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for arm in arms:
        for s in seeds:
            run = d / f"{arm}_s{s}.json"
            if not run.exists():
                continue
            for row in json.loads(run.read_text())["branches"]["recipe"]:
                k = row["update"]
                dep = d / f"deploy_{arm}_s{s}_u{k}.json"
                if not dep.exists():
                    continue
                real = json.loads(dep.read_text())["rows"]["nominal"]
                x = {"own_sim": row["forward_speed"], "own_sim_error": row["speed_error"],
                     "real_speed": real["forward_speed"], "real_error": real["speed_error"],
                     "upright": real["upright"], "real_minus_own_sim": real["forward_speed"] - row["forward_speed"]}
                out.setdefault(arm, {}).setdefault(s, {})[str(k)] = x
                print(f"| {arm} | {s} | {k} | {x['own_sim']:.3f} | {x['real_speed']:.3f} ({x['real_error']:.3f}) | "
                      f"{x['real_minus_own_sim']:+.3f} |")
        b = [x["real_minus_own_sim"] for v in out.get(arm, {}).values() for x in v.values()]
        if b:
            print(f"| {arm}: reality minus own sim over {len(b)} candidates | | | | | mean {sum(b) / len(b):+.3f}, "
                  f"range {min(b):+.3f} to {max(b):+.3f} |")
            out[arm]["mean_real_minus_own_sim"] = sum(b) / len(b)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="outputs/benchmarks/c4")
    ap.add_argument("--arms", default="nominal,calibrated,truth")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--out", default=None)
    ap.add_argument("--merge", default=None, metavar="JSON[,JSON]",
                    help="earlier --out files whose seeds are added where --dir lacks them")
    ap.add_argument("--pair", default="nominal,calibrated", metavar="A,B",
                    help="the seed-by-seed comparison of arm A's error in reality minus arm B's")
    ap.add_argument("--criterion", choices=("sign", "ttest"), default="sign",
                    help="sign: the 15th session's (sign test p < 0.05 and mean > 2 SE); ttest: the 17th "
                         "session's (one-sided paired t-test of A - B > 0, p < 0.05)")
    ap.add_argument("--candidates", action="store_true",
                    help="instead: every candidate saved with --save-candidates and deployed as "
                         "DIR/deploy_ARM_sS_uK.json (own sim, reality, their difference)")
    args = ap.parse_args(argv)
    d = Path(args.dir)
    if args.candidates:
        res = {"candidates": candidates(d, args.arms.split(","), args.seeds.split(","))}
        if args.out:
            Path(args.out).write_text(json.dumps(res, indent=1))
        return
    res = {"arms": {}}
    earlier = [json.loads(Path(f).read_text())["arms"] for f in args.merge.split(",")] if args.merge else []
    print("| arm | seed | own sim after 0 / 5 / ... actor updates (m/s) | kept | in reality: speed (error), m/s |")
    print("| --- | ---: | --- | ---: | ---: |")
    for arm in args.arms.split(","):
        rows = {}
        for e in earlier:
            for s, row in e.get(arm, {}).get("seeds", {}).items():
                rows.setdefault(s, {"real_minus_own_sim": row["real_speed"] - row["kept_own_sim"], **row,
                                    "from": args.merge})
        for s in args.seeds.split(","):
            run, dep = d / f"{arm}_s{s}.json", d / f"deploy_{arm}_s{s}.json"
            rec = d / f"{arm}_s{s}_recipe.pt.json"
            if not (run.exists() and dep.exists() and rec.exists()):
                continue
            r, p, k = json.loads(run.read_text()), json.loads(dep.read_text()), json.loads(rec.read_text())
            own = [x["forward_speed"] for x in r["branches"]["recipe"]]
            real = p["rows"]["nominal"]
            kept = next(x["forward_speed"] for x in r["branches"]["recipe"] if x["update"] == k["selection"]["kept"])
            rows[s] = {"own_sim": own, "kept": k["selection"]["kept"], "kept_own_sim": kept, "sim": k["sim"],
                       "real_speed": real["forward_speed"], "real_error": real["speed_error"],
                       "upright": real["upright"], "shipped_real": [p["rows"]["shipped"]["forward_speed"],
                                                                     p["rows"]["shipped"]["speed_error"]]}
            rows[s]["real_minus_own_sim"] = rows[s]["real_speed"] - kept
            print(f"| {arm} | {s} | {' / '.join(f'{x:.3f}' for x in own)} | {k['selection']['kept']} | "
                  f"{real['forward_speed']:.3f} ({real['speed_error']:.3f}) |")
        rows = dict(sorted(rows.items(), key=lambda kv: int(kv[0])))
        for s, x in rows.items():
            if "from" in x:
                print(f"| {arm} | {s} | {' / '.join(f'{v:.3f}' for v in x['own_sim'])} | {x['kept']} | "
                      f"{x['real_speed']:.3f} ({x['real_error']:.3f}) | (from {x['from']})")
        if rows:
            e = [x["real_error"] for x in rows.values()]
            v = [x["real_speed"] for x in rows.values()]
            res["arms"][arm] = {"seeds": rows, "mean_error": sum(e) / len(e), "error_spread": max(e) - min(e),
                                "mean_speed": sum(v) / len(v), "speed_spread": max(v) - min(v)}
            b = [x["real_minus_own_sim"] for x in rows.values()]
            res["arms"][arm].update(mean_real_minus_own_sim=sum(b) / len(b), real_minus_own_sim_range=[min(b), max(b)])
            print(f"| {arm}: mean over {len(e)} seeds | | | | {sum(v) / len(v):.3f} ({sum(e) / len(e):.3f}); "
                  f"spread {max(v) - min(v):.3f} ({max(e) - min(e):.3f}) |")
            print(f"| {arm}: reality minus own sim at the kept policy | | | | mean {sum(b) / len(b):+.3f}, "
                  f"range {min(b):+.3f} to {max(b):+.3f} |")
    a = res["arms"]
    if "nominal" in a and "calibrated" in a:
        # "Measurably better": the difference of the mean errors against the seed spreads.
        diff = a["calibrated"]["mean_error"] - a["nominal"]["mean_error"]
        res["calibrated_minus_nominal_error"] = diff
        print(f"\ncalibrated - nominal mean error {diff:+.3f} m/s; seed spreads (max - min) nominal "
              f"{a['nominal']['error_spread']:.3f}, calibrated {a['calibrated']['error_spread']:.3f}")
    A, B = args.pair.split(",")
    if A in a and B in a:
        c = paired(a[A]["seeds"], a[B]["seeds"])
        res["paired"] = {"a": A, "b": B, **c, "criterion": args.criterion,
                         "criterion_met": c["t_test_met"] if args.criterion == "ttest" else c["measurably_better"]}
        print(f"\n{A} - {B} error in reality, seeds {','.join(c['seeds'])}: "
              + " / ".join(f"{x:+.3f}" for x in c["difference"].values())
              + f"; mean {c['mean']:+.4f}, sd {c['sd']:.4f}, standard error {c['se']:.4f}; {B} lower on "
              f"{c['b_wins']} of {len(c['seeds'])} (ties {c['ties']}); sign test p = {c['sign_test_p']:.3f}; "
              f"sign test p < 0.05 and mean > 2 SE: {c['measurably_better']}; one-sided paired t-test "
              + (f"t = {c['t']:.3f}, {c['df']} degrees of freedom, p = {c['t_test_p_one_sided']:.4f}"
                 if c["t"] is not None else "undefined (the differences have no spread)"))
        print(f"criterion ({args.criterion}): {'met' if res['paired']['criterion_met'] else 'not met'}")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
