"""chorus.spark.run on local[2]."""
import pytest

import chorus.spark
from spark_cases import (test_a_failing_rank_fails_run_cancels_the_job_and_leaves_nothing,  # noqa: F401
                         test_replicas_are_equal_after_training, test_returns_every_rank_value_in_rank_order)
import workers
from conftest import spark_session


@pytest.fixture(scope="module", autouse=True)
def spark():
    session = spark_session("local[2]")
    yield session
    session.stop()


def test_more_ranks_than_slots_is_a_clear_error_within_start_timeout():
    with pytest.raises(TimeoutError, match=r"num_proc=3 needs 3 task slots.*offered 2"):
        chorus.spark.run(workers.identity, args=(1,), num_proc=3, start_timeout=2)


@pytest.mark.parametrize("kwargs, words", [
    ({"use_mpi": True}, "use_mpi=True cannot be honoured"),
    ({"use_gloo": False}, "use_gloo=False"),
    ({"extra_mpi_args": "-x FOO"}, "extra_mpi_args"),
    ({"num_proc": 0}, "num_proc=0"),
])
def test_horovod_choices_chorus_cannot_honour_are_refused(kwargs, words):
    with pytest.raises(ValueError, match=words):
        chorus.spark.run(workers.identity, args=(1,), **{"num_proc": 2, **kwargs})


def test_use_gloo_is_accepted():
    assert len(chorus.spark.run(workers.identity, args=(1,), num_proc=2, use_gloo=True)) == 2


def test_no_gpus_assigned_means_no_devices():
    import chorus.spark.task

    def devices():
        return chorus.spark.task.get_available_devices()

    assert chorus.spark.run(devices, num_proc=2) == [[], []]
