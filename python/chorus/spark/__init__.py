"""horovod.spark's names over chorus: run a function on Spark executors as one
chorus job (one barrier task per rank), and run_elastic for elastic jobs.

    import chorus.spark
    results = chorus.spark.run(train, args=(lr,), num_proc=4)  # rank order
"""
from chorus.spark.elastic import run_elastic
from chorus.spark.runner import run

__all__ = ["run", "run_elastic"]
