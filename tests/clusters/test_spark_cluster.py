"""chorus.spark.run on local-cluster[2,1,1024]: two executor JVMs of one core each."""
import pytest

import spark_cases
from conftest import spark_session


@pytest.fixture(scope="module", autouse=True)
def spark():
    session = spark_session("local-cluster[2,1,1024]")
    yield session
    session.stop()


def test_returns_every_rank_value_in_rank_order():
    spark_cases.returns_in_rank_order()


def test_a_failing_rank_fails_run_cancels_the_job_and_leaves_nothing():
    spark_cases.a_failing_rank_fails_run_and_leaves_nothing()


def test_replicas_are_equal_after_training():
    spark_cases.replicas_are_equal_after_training()
