"""The first version of instrumented_run.py (the runs of this folder) wrote train_cpu_s without the env and trainer
build, which --reach-table takes off (setup_cpu_s): this adds it to each curve point, once (marks the file).
Usage: python add_setup_cpu.py OUT.json ..."""
import json, sys
for f in sys.argv[1:]:
    d = json.load(open(f))
    if d.get("setup_added"):
        continue
    for c in d["shac"][0]["curve"]:
        c["train_cpu_s"] += c["setup_cpu_s"]
    for r in d.get("log", []):
        r["cpu"] += d["shac"][0]["curve"][0]["setup_cpu_s"] if d["shac"][0]["curve"] else 0.0
    d["setup_added"] = True
    json.dump(d, open(f, "w"), indent=0)
