"""chorus.spark.run_elastic on local-cluster[2,1,1024]: an executor killed while the job
trains (its worker is lost, the other goes on from the last commit), then the
replacement executor Spark's master starts (the lost task runs again there and its
worker joins)."""
import os
import signal
import subprocess
import threading

import pytest
import torch

import chorus.spark
import workers
from conftest import progress_of, eventually, job_segments, rank_processes, spark_session


@pytest.fixture(scope="module")
def spark():
    session = spark_session("local-cluster[2,1,1024]")
    yield session
    session.stop()


def executor_pids(app_id):
    out = subprocess.run(["pgrep", "-f", f"CoarseGrainedExecutorBackend.*{app_id}"], stdout=subprocess.PIPE,
                         text=True).stdout
    return sorted(int(p) for p in out.split())


def test_an_executor_lost_and_replaced(spark, tmp_path):
    progress, stop = str(tmp_path / "progress"), str(tmp_path / "stop")
    outcome = {}

    def go():
        try:
            outcome["results"] = chorus.spark.run_elastic(
                workers.elastic_train, kwargs={"batches": 100000, "progress": progress, "stop_file": stop},
                num_proc=2, min_num_proc=1, max_num_proc=2, elastic_timeout=60, start_timeout=120)
        except BaseException as e:  # noqa: BLE001 - checked below
            outcome["error"] = e

    thread = threading.Thread(target=go)
    thread.start()
    sizes_now = lambda: [size for _, size in progress_of(progress)]  # noqa: E731
    assert eventually(lambda: 2 in sizes_now()[5:], 180), sizes_now()
    pids = executor_pids(spark.sparkContext.applicationId)
    assert len(pids) == 2, pids
    os.kill(pids[-1], signal.SIGKILL)
    assert eventually(lambda: 1 in sizes_now()[-5:], 120), sizes_now()
    # Spark's master starts a replacement executor; the lost task runs again there and its worker joins.
    assert eventually(lambda: sizes_now()[-5:] == [2] * 5, 180), sizes_now()[-20:]
    open(stop, "w").close()
    thread.join(300)
    assert not thread.is_alive()
    assert "error" not in outcome, outcome.get("error")
    results = outcome["results"]
    final = results[0]
    assert len(final["sizes"]) == final["batch"]
    sizes = final["sizes"]
    first_one = sizes.index(1)
    assert 2 in sizes[:first_one] and sizes[-1] == 2, sizes  # shrunk, then grew again
    assert all(r["unequal"] == [] for r in results)
    for a, b in zip(results[0]["params"], results[-1]["params"]):
        assert torch.equal(a, b)
    assert eventually(lambda: not rank_processes())
    assert eventually(lambda: not job_segments("sparkelastic-"))


def test_bad_bounds_are_refused(spark):
    with pytest.raises(ValueError, match=r"min_num_proc \(3\) <= num_proc \(2\)"):
        chorus.spark.run_elastic(workers.identity, args=(0,), num_proc=2, min_num_proc=3, max_num_proc=4)
