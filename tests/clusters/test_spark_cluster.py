"""chorus.spark.run on local-cluster[2,1,1024]: two executor JVMs of one core each."""
import pytest

from spark_cases import (test_a_failing_rank_fails_run_cancels_the_job_and_leaves_nothing,  # noqa: F401
                         test_replicas_are_equal_after_training, test_returns_every_rank_value_in_rank_order)
from conftest import spark_session


@pytest.fixture(scope="module", autouse=True)
def spark():
    session = spark_session("local-cluster[2,1,1024]")
    yield session
    session.stop()
