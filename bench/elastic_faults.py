"""The time an elastic job takes from a fault to its first completed step after it,
on namespace hosts (2 hosts x 2 workers; tests/multihost/testbed.py, needs root).

Scenarios: a worker on node2 killed with signal 9 mid-training, and node2's link
taken down. For each, the moments (seconds after the fault) at which chorusrun
reported the failure, published the next round, the state was synchronized (the
worker's "resuming" line) and the first step after it completed.

    sudo /usr/bin/python3 bench/elastic_faults.py [--build build] [--timeout 10]
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "multihost"))
import testbed  # noqa: E402

TRAIN = os.path.join(REPO, "tests", "multihost", "workers", "elastic_train.py")
MARKS = [("detected", r"chorusrun: worker .* (was killed|lost its ssh|exited)"),
         ("blacklisted", r"host node2 is blacklisted"),
         ("round", r"chorusrun: round [2-9]"),
         ("synced", r"resuming from commit \d+ with 2 ranks"),
         ("first step", r"step \d+ size 2")]


def scenario(bed, build, env, fault, transport_timeout):
    work = tempfile.mkdtemp(prefix="chorus-faults-")
    listing = os.path.join(work, "hosts")
    open(listing, "w").write("node1\nnode2\n")
    script = os.path.join(work, "discover.sh")
    open(script, "w").write(f"#!/bin/sh\ncat {listing}\n")
    os.chmod(script, 0o755)
    e = dict(env, STEPS="40", STEP_PAUSE="0.25", CHORUS_TIMEOUT_SECONDS=str(transport_timeout))
    cmd = [os.path.join(build, "chorusrun"), "--min-np", "2", "--max-np", "4", "--host-discovery-script", script,
           "--slots-per-host", "2", *bed.ssh_args(), "-x", "STEPS", "-x", "STEP_PAUSE", "python", TRAIN,
           os.path.join(work, "result.json")]
    proc = bed.popen("node1", cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    t0, seen = None, {}
    for line in proc.stdout:
        now = time.time()
        if t0 is None and re.search(r"step 8 size 4", line):
            t0 = time.time()
            if fault == "kill":
                bed.kill("node2", "elastic_train.py", one=True)
            else:
                bed.link("node2", up=False)
            continue
        if t0 is not None:
            for name, pattern in MARKS:
                if name not in seen and re.search(pattern, line):
                    seen[name] = now - t0
    proc.wait()
    if fault == "link":
        bed.link("node2", up=True)
    return proc.returncode, seen


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--timeout", type=float, default=10, help="CHORUS_TIMEOUT_SECONDS: peer death over TCP")
    args = ap.parse_args()
    why = testbed.unavailable()
    if why:
        sys.exit(f"elastic_faults: {why}")
    build = os.path.abspath(args.build)
    with testbed.TestBed(2) as bed:
        bindir = os.path.join(bed.work, "bin")
        os.makedirs(bindir)
        with open(os.path.join(bindir, "python"), "w") as f:
            f.write(f"#!/bin/sh\nexport PYTHONPATH={build}/python\nexec /usr/bin/python3 \"$@\"\n")
        os.chmod(os.path.join(bindir, "python"), 0o755)
        env = dict(os.environ, PATH=bindir + ":" + os.environ["PATH"], PYTHONPATH=f"{build}/python",
                   OMP_NUM_THREADS="1")
        print(f"seconds after the fault (transport timeout {args.timeout:g} s)")
        print(f"{'fault':>10} " + " ".join(f"{n:>12}" for n, _ in MARKS) + "   exit")
        for fault in ("kill", "link"):
            rc, seen = scenario(bed, build, env, fault, args.timeout)
            print(f"{fault:>10} " + " ".join(f"{seen[n]:>12.2f}" if n in seen else f"{'-':>12}" for n, _ in MARKS)
                  + f"   {rc}")


if __name__ == "__main__":
    main()
