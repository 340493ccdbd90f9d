"""Trim a run's console log to oma's lines and the step metrics; write the metrics as JSON."""
import json, re, sys
log, out_log, out_json, name = sys.argv[1:5]
keep, steps = [], {}
for line in open(log, errors="replace"):
    line = re.sub(r"\x1b\[[0-9;]*m", "", line.rstrip("\n"))
    if "oma:" in line or "rc=" in line[:5]:
        keep.append(line)
    m = re.search(r"\bstep:(\d+) - (.*)$", line)
    if m:
        vals = {}
        for kv in m.group(2).split(" - "):
            k, _, v = kv.partition(":")
            v = re.sub(r"^np\.\w+\((.*)\)$", r"\1", v.strip())
            try:
                vals[k.strip()] = float(v)
            except ValueError:
                pass
        steps[int(m.group(1))] = vals
        wanted = {k: v for k, v in vals.items() if k.startswith(("oma/", "actor/", "critic/score", "critic/advantages", "episode/", "timing_s/step", "response_length/mean"))}
        keep.append(f"step:{m.group(1)} - " + " - ".join(f"{k}:{v:.6g}" for k, v in wanted.items()))
open(out_log, "w").write("\n".join(keep) + "\n")
json.dump({"run": name, "steps": {str(k): v for k, v in sorted(steps.items())}}, open(out_json, "w"), indent=1, sort_keys=True)
print(open(out_log).read())
