"""Collect the fine-tuning arms of the calibration loop (13th and 14th sessions) into one JSON and a markdown table.

Each arm is a ``calibration_loop_overshoot.py --branches recipe --save-policies DIR/ARM_sS`` run
(``DIR/ARM_sS.json``) and its deployment ``calibration_loop.py --deploy-only --nominal-policy
DIR/ARM_sS_recipe.pt --out DIR/deploy_ARM_sS.json``. Per arm and seed: the own-sim speed after
0, 5, ... actor updates, the kept checkpoint, and in reality the forward speed and the speed-tracking
error; per arm the mean and the spread (max - min) over seeds.

    python benchmarks/calibration_arms_table.py --dir outputs/benchmarks/c4 --out benchmarks/results/go1_calib_arms_13th.json
    python benchmarks/calibration_arms_table.py --dir outputs/benchmarks/c5 --seeds 0,1,2 --out benchmarks/results/go1_calib_arms_14th.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="outputs/benchmarks/c4")
    ap.add_argument("--arms", default="nominal,calibrated,truth")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    d = Path(args.dir)
    res = {"arms": {}}
    print("| arm | seed | own sim after 0 / 5 / ... actor updates (m/s) | kept | in reality: speed (error), m/s |")
    print("| --- | ---: | --- | ---: | ---: |")
    for arm in args.arms.split(","):
        rows = {}
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
            print(f"| {arm} | {s} | {' / '.join(f'{x:.3f}' for x in own)} | {k['selection']['kept']} | "
                  f"{real['forward_speed']:.3f} ({real['speed_error']:.3f}) |")
        if rows:
            e = [x["real_error"] for x in rows.values()]
            v = [x["real_speed"] for x in rows.values()]
            res["arms"][arm] = {"seeds": rows, "mean_error": sum(e) / len(e), "error_spread": max(e) - min(e),
                                "mean_speed": sum(v) / len(v), "speed_spread": max(v) - min(v)}
            print(f"| {arm}: mean over {len(e)} seeds | | | | {sum(v) / len(v):.3f} ({sum(e) / len(e):.3f}); "
                  f"spread {max(v) - min(v):.3f} ({max(e) - min(e):.3f}) |")
    a = res["arms"]
    if "nominal" in a and "calibrated" in a:
        # "Measurably better": the difference of the mean errors against the seed spreads.
        diff = a["calibrated"]["mean_error"] - a["nominal"]["mean_error"]
        res["calibrated_minus_nominal_error"] = diff
        print(f"\ncalibrated - nominal mean error {diff:+.3f} m/s; seed spreads (max - min) nominal "
              f"{a['nominal']['error_spread']:.3f}, calibrated {a['calibrated']['error_spread']:.3f}")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
