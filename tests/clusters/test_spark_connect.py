"""chorus.spark.run under Spark Connect (no SparkContext): barrier tasks through mapInArrow."""
import pytest

import chorus.spark
from spark_cases import test_replicas_are_equal_after_training, test_returns_every_rank_value_in_rank_order  # noqa: F401
import workers
from conftest import eventually, rank_processes, spark_session


@pytest.fixture(scope="module", autouse=True)
def spark():
    session = spark_session("connect:local[2]")
    assert type(session).__module__.startswith("pyspark.sql.connect")
    yield session
    session.stop()


def test_a_failing_rank_fails_run():
    # Without a reachable driver, the others end at chorus's peer-failure timeout,
    # so this rank waits in a collective rather than outside chorus.
    def fail_in_collective():
        import torch
        import chorus.torch as hvd
        hvd.init()
        if hvd.rank() == 1:
            raise ValueError("rank 1 gives up on purpose")
        hvd.allreduce(torch.ones(1))
    with pytest.raises(chorus.spark.runner.SparkJobError, match="rank 1 gives up on purpose"):
        chorus.spark.run(fail_in_collective, num_proc=2)
    assert eventually(lambda: not rank_processes()), rank_processes()
    test_returns_every_rank_value_in_rank_order()
