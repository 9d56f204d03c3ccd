"""Runs Horovod's own test files against chorus, unchanged, through the horovod
alias (`python -m chorus.alias install horovod`, here into a folder of its own),
and reports how many of each file's tests pass. Horovod's tests are not part of
this repository: point --tests at a checkout of Horovod's test/ folder.

    python bench/horovod_suites.py --tests ~/horovod/test --python build/venv-torch2/bin/python \
        parallel/test_torch.py single/test_torch_elastic.py

A test counts as passed when it passes on every rank, as skipped when a rank
skips it (no GPU, not built with MPI...), and as failed otherwise; the rate is
passed / (passed + failed). Each file runs in its own job (-np ranks, default 2).

Two things make older test files run on today's stack, and both are reported:
a pytest plugin (COMPAT) gives Python 3.11 back inspect.getargspec, keeps
torch >= 2.9's Muon (2-D parameters only) out of the torch.optim optimizers the
torch files loop over, and under --legacy-keras lets `import keras` be tf_keras
(the tests were written where it was Keras 2); and OLDER_API lists tests whose expectations Horovod itself
changed in a later release (chorus follows Horovod 0.28), or that fail on today's
stack before reaching Horovod (Keras 2's layer API, NumPy 1's type promotion):
they are not run, and the report counts them apart with the reason.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

# test id (file::class::name) -> what Horovod 0.28 (or today's stack) does instead
OLDER_API = {
    "test_torch.py::TorchTests::test_horovod_allgather_grad":
        "expects the summed gradient; Horovod >= 0.23 averages it (allreduce average=True)",
    "test_torch.py::TorchTests::test_horovod_broadcast_grad":
        "expects the summed gradient on the root; Horovod >= 0.23 averages it",
    "test_torch.py::TorchTests::test_horovod_alltoall":
        "expects a tensor from alltoall(t, splits); Horovod >= 0.23 returns (tensor, received_splits)",
    "test_torch.py::TorchTests::test_horovod_alltoall_grad":
        "expects a tensor from alltoall(t, splits); Horovod >= 0.23 returns (tensor, received_splits)",
    "test_torch.py::TorchTests::test_dynamic_requires_grad":
        "reads p.grad of a parameter no backward has reached: older Horovod zero-filled every gradient when "
        "the optimizer was built; Horovod 0.28 leaves it None until computed (and torch >= 2's zero_grad sets None)",
    "test_tensorflow.py::TensorFlowTests::test_horovod_syncbn_cpu":
        "builds its reference with Keras 2's BatchNormalization(fused=False).apply(x): Keras 3 refuses fused, "
        "tf_keras has no Layer.apply; it fails on the plain Keras layer before reaching Horovod or chorus",
    "test_tensorflow_process_sets.py::TensorFlowProcessSetsTests::test_horovod_reducescatter_grad_cpu_process_sets":
        "compares a float16 error with 1e-8: under NumPy 2's promotion (NEP 50) 1e-8 becomes float16 zero, so an "
        "exact gradient (error 0) fails 'err < 1e-8'; it passes under NumPy 1",
    "test_tensorflow.py::TensorFlowTests::test_horovod_allgather_grad_cpu":
        "expects the summed gradient; Horovod >= 0.23 averages it (_allreduce(grad, op=Average))",
    "test_tensorflow.py::TensorFlowTests::test_horovod_allgather_grad_gpu":
        "expects the summed gradient; Horovod >= 0.23 averages it (_allreduce(grad, op=Average))",
    "test_tensorflow.py::TensorFlowTests::test_horovod_broadcast_grad_cpu":
        "expects the summed gradient on the root; Horovod >= 0.23 averages it",
    "test_tensorflow.py::TensorFlowTests::test_horovod_broadcast_grad_gpu":
        "expects the summed gradient on the root; Horovod >= 0.23 averages it",
    "test_tensorflow.py::TensorFlowTests::test_horovod_alltoall_cpu":
        "expects a tensor from alltoall(t, splits); Horovod >= 0.23 returns (tensor, received_splits)",
    "test_tensorflow.py::TensorFlowTests::test_horovod_alltoall_grad_cpu":
        "expects a tensor from alltoall(t, splits); Horovod >= 0.23 returns (tensor, received_splits)",
    "test_tensorflow.py::TensorFlowTests::test_horovod_alltoall_one_rank_receives_nothing_cpu":
        "expects a tensor from alltoall(t, splits); Horovod >= 0.23 returns (tensor, received_splits)",
    "test_tensorflow.py::TensorFlowTests::test_horovod_alltoall_one_rank_sends_nothing_cpu":
        "expects a tensor from alltoall(t, splits); Horovod >= 0.23 returns (tensor, received_splits)",
    "test_tensorflow.py::TensorFlowTests::test_horovod_alltoall_zero_splits_cpu":
        "expects a tensor from alltoall(t, splits); Horovod >= 0.23 returns (tensor, received_splits)",
}

COMPAT = """import inspect
import os
import sys
if not hasattr(inspect, "getargspec"):
    inspect.getargspec = inspect.getfullargspec  # removed in Python 3.11
if "torch" in os.environ.get("CHORUS_HVD_SUITE", ""):
    import torch
    if hasattr(torch.optim, "Muon"):  # the tests select optimizers by module name
        torch.optim.Muon.__module__ = "muon_2d_parameters_only"
if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
    import types
    import tensorflow as tf
    import tf_keras
    from tf_keras.src.optimizers.legacy import optimizer_v2 as _v2
    sys.modules["keras"] = tf_keras
    if not hasattr(tf.keras, "__version__"):
        tf.keras.__version__ = tf_keras.__version__
    _pkg = types.ModuleType("keras.optimizers.optimizer_v2")  # Keras 2.9/2.10's module path
    _pkg.optimizer_v2 = _v2
    sys.modules["keras.optimizers.optimizer_v2"] = _pkg
    sys.modules["keras.optimizers.optimizer_v2.optimizer_v2"] = _v2
"""

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def results(xml_path):
    """test id -> 'passed' | 'skipped' | 'failed' (with the first message line)."""
    out = {}
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        tid = f"{case.get('classname')}.{case.get('name')}"
        state, why = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                state, why = "failed", (child.get("message") or "").splitlines()[0:1]
                why = why[0][:160] if why else ""
                break
            if child.tag == "skipped":
                state, why = "skipped", (child.get("message") or "")[:100]
        out[tid] = (state, why)
    return out


def run_file(args, shim, rel):
    path = os.path.join(args.tests, rel)
    workdir = tempfile.mkdtemp(prefix="hvd-suite-")
    xml = os.path.join(workdir, "rank-%r.xml")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([shim, os.path.join(args.tests, "utils"), args.tests,
                                         os.path.dirname(path), os.path.join(args.build, "python")]
                                        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["CHORUS_HVD_SUITE"] = os.path.basename(path)
    if args.legacy_keras:
        env["TF_USE_LEGACY_KERAS"] = "1"
    # A test that fails on one rank between collectives leaves the ranks on
    # different paths: its ops fail after 5 s instead of 60, and the file goes on.
    env.setdefault("CHORUS_BLOCKED_FAIL_SECONDS", "5")
    # Each rank writes its own report (the rank's number from the environment).
    base = os.path.basename(path)
    older = [t for t in OLDER_API if t.startswith(base + "::")]
    pytest_args = (["-v", "-p", "no:cacheprovider", "-p", "chorus_hvd_compat"] + (["-x"] if args.exitfirst else [])
                   + [a for t in older for a in ("--deselect", t)] + args.pytest_args)
    code = ("import os, sys, pytest; "
            "r = os.environ.get('CHORUS_RANK', os.environ.get('OMPI_COMM_WORLD_RANK', '0')); "
            f"sys.exit(pytest.main({pytest_args!r} + ['--junitxml=' + {xml!r}.replace('%r', r), {path!r}]))")
    np = 1 if rel.startswith("single/") else args.np
    if args.mpirun:  # Open MPI starts the ranks (for files that need mpi4py's communicators)
        cmd = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", str(np)]
        cmd += [a for k in ("PYTHONPATH", "TF_USE_LEGACY_KERAS", "CHORUS_BLOCKED_FAIL_SECONDS", "CHORUS_HVD_SUITE") if k in env
                for a in ("-x", k)]
        cmd += [args.python, "-c", code]
    else:
        cmd = [os.path.join(args.build, "chorusrun"), "-np", str(np), args.python, "-c", code]
    log_path = os.path.join(args.log or workdir, rel.replace("/", "_") + ".log")
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "w") as out:  # written as the job runs, to follow a long file
        try:
            subprocess.run(cmd, env=env, cwd=os.path.dirname(path), stdout=out, stderr=subprocess.STDOUT,
                           timeout=args.timeout)
        except subprocess.TimeoutExpired:
            out.write(f"\n(timed out after {args.timeout} s)\n")
    with open(log_path) as f:
        log = f.read()
    per_rank = [results(xml.replace("%r", str(r))) for r in range(np)
                if os.path.exists(xml.replace("%r", str(r)))]
    shutil.rmtree(workdir, ignore_errors=True)
    merged = {}
    for ranks in per_rank:
        for tid, (state, why) in ranks.items():
            old = merged.get(tid)
            if old is None or (state == "failed") or (state == "skipped" and old[0] == "passed"):
                merged[tid] = (state, why)
    if len(per_rank) < np:
        log_tail = "\n".join(log.splitlines()[-30:])
        merged.setdefault("(job)", ("failed", f"only {len(per_rank)} of {np} ranks reported:\n{log_tail}"))
    for t in older:
        merged[t] = ("older-api", OLDER_API[t])
    return merged, log


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tests", required=True, help="Horovod's test/ folder")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("-np", "--np", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--legacy-keras", action="store_true", help="TF_USE_LEGACY_KERAS=1 (Keras 2 through tf_keras)")
    ap.add_argument("--exitfirst", action="store_true")
    ap.add_argument("--mpirun", action="store_true", help="start the ranks with Open MPI's mpirun, not chorusrun")
    ap.add_argument("--show", action="store_true", help="list every failed test with its message")
    ap.add_argument("--log", help="folder for each file's job output")
    ap.add_argument("files", nargs="+", help="paths under --tests, e.g. parallel/test_torch.py")
    args, args.pytest_args = ap.parse_known_args()
    shim = tempfile.mkdtemp(prefix="hvd-alias-")
    with open(os.path.join(shim, "chorus_hvd_compat.py"), "w") as f:
        f.write(COMPAT)
    sys.path.insert(0, os.path.join(args.build, "python"))
    subprocess.run([args.python, "-c", "import sys; from chorus.alias import install_package; "
                    "install_package('horovod', sys.argv[1])", shim],
                   env=dict(os.environ, PYTHONPATH=os.path.join(args.build, "python")), check=True)
    total = [0, 0, 0]
    for rel in args.files:
        merged, log = run_file(args, shim, rel)
        n = {s: sum(1 for v in merged.values() if v[0] == s) for s in ("passed", "failed", "skipped", "older-api")}
        applicable = n["passed"] + n["failed"]
        rate = 100.0 * n["passed"] / applicable if applicable else 0.0
        print(f"{rel}: {n['passed']}/{applicable} passed ({rate:.0f}%), {n['skipped']} skipped, "
              f"{n['older-api']} written for an older Horovod or stack not run", flush=True)
        if args.show:
            for tid, (state, why) in sorted(merged.items()):
                if state in ("failed", "older-api"):
                    print(f"    {'FAIL' if state == 'failed' else 'OLDER'} {tid}: {why}")
        total = [total[0] + n["passed"], total[1] + n["failed"], total[2] + n["skipped"]]
    shutil.rmtree(shim, ignore_errors=True)
    applicable = total[0] + total[1]
    print(f"all: {total[0]}/{applicable} passed ({100.0 * total[0] / max(applicable, 1):.0f}%), {total[2]} skipped")


if __name__ == "__main__":
    main()
