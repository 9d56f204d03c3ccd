"""How long each rank waits on an MoE layer's dispatch, beside the experts' compute:
runs bench/peers/moe.py under chorus on 4 ranks (ep 2 x dp 2, ZeRO-2) with every
rank's timeline (CHORUS_TIMELINE=...%r.json) and its experts' forward times, then
prints, per rank, the dispatch alltoalls' negotiation spans (from this rank's
request to every rank's: the time it waited for the others) against the slowest
rank's expert forward in the same step.

    /usr/bin/python3 bench/moe_timeline.py [--python build/venv-torch2/bin/python]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def spans(path, row_suffix, event):
    """Durations (us) of `event` spans in the rows whose name ends with row_suffix."""
    events = json.load(open(path))
    rows = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    opened, out = {}, []
    for e in events:
        if not rows.get(e.get("pid"), "").endswith(row_suffix):
            continue
        if e.get("ph") == "B" and e.get("name") == event:
            opened[e["pid"]] = e["ts"]
        elif e.get("ph") == "E" and e["pid"] in opened:
            out.append(e["ts"] - opened.pop(e["pid"]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=os.path.join(ROOT, "build", "venv-torch2", "bin", "python"))
    ap.add_argument("--steps", type=int, default=15)
    args = ap.parse_args()
    where = tempfile.mkdtemp(prefix="chorus-moe-tl-")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "build", "python"), OMP_NUM_THREADS="1",
               CHORUS_TIMELINE=os.path.join(where, "tl.%r.json"))
    cmd = [os.path.join(ROOT, "build", "chorusrun"), "-np", "4", args.python,
           os.path.join(ROOT, "bench", "peers", "moe.py"), "--framework", "chorus", "--steps", str(args.steps),
           "--expert-times", os.path.join(where, "experts.%r.json")]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    experts = [[d * 1e6 for _, d in json.load(open(os.path.join(where, f"experts.{r}.json")))] for r in range(4)]
    slowest = [max(col) for col in zip(*experts)]  # per layer call: the slowest rank's expert forward (us)
    print(f"expert forward, slowest rank per layer call: median {statistics.median(slowest):.0f} us, "
          f"max {max(slowest):.0f} us")
    for r in range(4):
        waits = spans(os.path.join(where, f"tl.{r}.json"), ".dispatch", "NEGOTIATE_ALLTOALL")
        over = sum(1 for w, s in zip(waits, slowest) if w > s)
        print(f"rank {r}: dispatch wait median {statistics.median(waits):.0f} us, max {max(waits):.0f} us; "
              f"{over} of {len(waits)} waits longer than that call's slowest expert forward")


if __name__ == "__main__":
    sys.exit(main())
