"""The GPU suite's harness, run here without a GPU (tests/gpu/run.sh --dry-run): the same
checks on CPU tensors and the host engine, the deadline, and what comes back from the lent
machine ($OUT: three files). This is not a GPU test: run.sh without --dry-run is, on a GPU."""
import json
import os
import subprocess
import tarfile

from conftest import REPO

RUN = os.path.join(REPO, "tests", "gpu", "run.sh")
# The checks that need a GPU: SKIPPED, by name, in a dry run.
NEEDS_GPU = {"cuda_backend", "collectives_2ranks_host_asked", "nccl_one_rank", "nccl_one_rank_collectives",
             "shared_gpu_logs_staged_once"}


def _dry_run(out, **env):
    proc = subprocess.run(["bash", RUN, "--dry-run"], env={**os.environ, "OUT": str(out), **env},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert sorted(os.listdir(out)) == ["logs.tgz", "results.json", "summary.txt"], (os.listdir(out), proc.stdout)
    with open(os.path.join(out, "results.json")) as f:
        return proc, json.load(f)


def test_gpu_suite_dry_run_passes_and_packs_three_files(tmp_path):
    proc, res = _dry_run(tmp_path / "out")
    status = {c["name"]: c["status"] for c in res["checks"]}
    assert proc.returncode == 0 and res["verdict"].startswith("PASSED"), proc.stdout[-5000:]
    assert {n for n, s in status.items() if s == "SKIPPED"} == NEEDS_GPU, status
    assert all(s in ("PASS", "SKIPPED") for s in status.values()), status
    # The checks that decide the most come first; a rank's death is judged on what was printed.
    assert list(status)[:4] == ["environment", "collectives_1rank", "seed_deepspeed_1rank", "zero_device_1rank"]
    assert status["peer_death"] == "PASS"
    with tarfile.open(tmp_path / "out" / "logs.tgz") as tar:
        logs = set(tar.getnames())
    assert all(f"logs/{n}.log" in logs for n, s in status.items() if s == "PASS" and n != "environment"), logs
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "0 failed" in summary and "0 not run" in summary and "dry run" in summary, summary


def test_gpu_suite_past_its_deadline_is_incomplete_not_passed(tmp_path):
    proc, res = _dry_run(tmp_path / "out", SUITE_DEADLINE="12")
    status = {c["name"]: c["status"] for c in res["checks"]}
    notrun = [n for n, s in status.items() if s == "NOT RUN"]
    assert proc.returncode != 0 and res["verdict"].startswith("INCOMPLETE"), (res["verdict"], proc.stdout[-3000:])
    assert notrun and "ulysses_2ranks" in notrun, status
    assert all(f"NOT RUN {n}" in proc.stdout for n in notrun), proc.stdout[-3000:]


def test_gpu_suite_failure_shows_its_first_traceback(tmp_path):
    bad = tmp_path / "python3"  # an interpreter whose every script fails with a traceback
    bad.write_text("#!/bin/sh\n/usr/bin/python3 -c 'def boom():\n    raise ValueError(\"planted\")\nboom()'\n")
    bad.chmod(0o755)
    proc, res = _dry_run(tmp_path / "out", PYTHON=str(bad), SUITE_DEADLINE="30")
    status = {c["name"]: c["status"] for c in res["checks"]}
    assert proc.returncode != 0 and res["verdict"].startswith("FAILED"), res["verdict"]
    assert status["collectives_1rank"] == "FAIL", status
    assert "ValueError: planted" in proc.stdout and "Traceback (most recent call last)" in proc.stdout, proc.stdout[-3000:]


def test_gpu_suite_scripts_parse():
    for script in ("run.sh", "bundle.sh"):
        subprocess.run(["bash", "-n", os.path.join(REPO, "tests", "gpu", script)], check=True)
