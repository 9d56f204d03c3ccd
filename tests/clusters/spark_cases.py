"""The chorus.spark.run cases every Spark mode runs (local, local-cluster, Connect):
each test file imports the test_ functions it shares, under its own session."""
import io

import pytest
import torch

import chorus.spark
import workers
from conftest import eventually, job_segments, rank_processes


def test_returns_every_rank_value_in_rank_order(num_proc=2):
    out = io.StringIO()
    results = chorus.spark.run(workers.identity, args=("x",), num_proc=num_proc, env={"CHORUS_TEST_VALUE": "v1"},
                               stdout=out)
    assert [r["rank"] for r in results] == list(range(num_proc))
    expected = [float(sum(range(1, num_proc + 1)))] * 3  # every rank's rank+1, summed
    for r in results:
        assert r["size"] == num_proc and r["sum"] == expected and r["x"] == "x" and r["env"] == "v1"
    assert len({r["pid"] for r in results}) == num_proc
    # One host (the loopback): local ranks 0..n-1.
    assert sorted(r["local_rank"] for r in results) == list(range(num_proc))
    for rank in range(num_proc):
        assert f"[{rank}]<stdout>:rank {rank} says hello" in out.getvalue()
    return results


def test_a_failing_rank_fails_run_cancels_the_job_and_leaves_nothing(num_proc=2):
    with pytest.raises(chorus.spark.runner.SparkJobError) as info:
        chorus.spark.run(workers.fail_on, args=(1,), num_proc=num_proc)
    assert info.value.rank == 1
    assert "rank 1 gives up on purpose" in str(info.value)
    assert "fail_on" in info.value.traceback  # the rank's own traceback
    # Rank 0 lingered 120 s outside chorus: cancelling the job group ended it.
    assert eventually(lambda: not rank_processes()), rank_processes()
    job = info.value.job_id
    assert job.startswith("spark-") and eventually(lambda: not job_segments(job)), job_segments(job)
    # The session still runs jobs.
    test_returns_every_rank_value_in_rank_order(num_proc)


def test_replicas_are_equal_after_training(num_proc=2):
    results = chorus.spark.run(workers.train, kwargs={"steps": 15}, num_proc=num_proc)
    first = results[0]["params"]
    for r in results[1:]:
        for a, b in zip(first, r["params"]):
            assert torch.equal(a, b)
    losses = results[0]["losses"]
    assert losses[-1] < losses[0] / 2, losses
