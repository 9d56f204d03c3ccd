"""Collectives across two namespace hosts beside raw TCP on the same link.

Makes the test bed (tests/multihost/testbed.py, needs root), measures what raw
TCP moves over the veth link in both directions at once (chorus-link-bench), then
a 2-host x 2-rank allreduce with the hierarchical path (shared memory within a
host, TCP between the hosts) and with the flat TCP path. An allreduce of S bytes
between two hosts sends S bytes each way across the link, so its algorithm
bandwidth S/t is bounded by the link's per-direction bandwidth; the table gives
the fraction reached.

    sudo /usr/bin/python3 bench/multihost_bench.py [--build build] [--json out.json]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "multihost"))
import testbed  # noqa: E402


def link(bed, build, seconds, rounds):
    rates = []
    for i in range(rounds):
        port = str(5201 + i)
        server = bed.popen("node2", [os.path.join(build, "chorus-link-bench"), "serve", port, bed.address("node2")],
                           stdout=subprocess.PIPE, text=True)
        server.stdout.readline()  # listening
        out = bed.run("node1", [os.path.join(build, "chorus-link-bench"), "send", "node2", port, str(seconds)],
                      stdout=subprocess.PIPE, text=True, check=True).stdout
        server.wait(timeout=30)
        r = json.loads(out)
        rates.append(min(r["sent_GBps"], r["received_GBps"]))
    return rates


def allreduce(bed, build, hierarchical, sizes, rounds):
    rows = os.path.join(bed.work, f"allreduce_h{hierarchical}.json")
    env = dict(os.environ, CHORUS_HIERARCHICAL_ALLREDUCE=str(hierarchical), OMP_NUM_THREADS="1")
    cmd = [os.path.join(build, "chorusrun"), "-np", "4", "-H", "node1:2,node2:2", *bed.ssh_args(),
           os.path.join(build, "chorus-bench"), "--coll", "allreduce", "-b", sizes[0], "-e", sizes[1], "-f", "4",
           "-w", "3", "-n", "10", "-r", str(rounds), "--json", rows]
    proc = bed.run("node1", cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise RuntimeError(proc.stdout)
    return [r for r in json.load(open(rows)) if r.get("path") == "chorus"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"))
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-b", default="1M")
    ap.add_argument("-e", default="64M")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    why = testbed.unavailable()
    if why:
        sys.exit(f"multihost_bench: {why}")
    with testbed.TestBed(2) as bed:
        rates = link(bed, build, 3, args.rounds)
        raw = statistics.median(rates)
        print(f"raw TCP over the veth link, both directions at once: {raw:.3f} GB/s per direction "
              f"(rounds: {', '.join(f'{r:.3f}' for r in rates)})")
        result = {"link_GBps_per_direction": raw, "link_rounds": rates, "rows": {}}
        table = {}
        for h in (1, 0):
            for r in allreduce(bed, build, h, (args.b, args.e), args.rounds):
                table.setdefault(r["bytes"], {})[h] = r
            result["rows"][f"hierarchical={h}"] = [table[b][h] for b in sorted(table) if h in table[b]]
        print(f"{'bytes':>10} {'hier us':>10} {'flat us':>10} {'hier GB/s':>10} {'flat GB/s':>10} "
              f"{'hier/link':>10} {'hier/flat':>10}")
        for b in sorted(table):
            h, f = table[b][1], table[b][0]
            hb, fb = b / h["time_us"] / 1e3, b / f["time_us"] / 1e3
            print(f"{b:>10} {h['time_us']:>10.1f} {f['time_us']:>10.1f} {hb:>10.3f} {fb:>10.3f} "
                  f"{hb / raw:>10.2f} {f['time_us'] / h['time_us']:>10.2f}")
        if args.json:
            with open(args.json, "w") as out:
                json.dump(result, out, indent=1)


if __name__ == "__main__":
    main()
