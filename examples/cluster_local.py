"""Loopback clusters for the Ray and Spark examples (--local-cluster): a Ray head with
two one-CPU nodes, or Spark's local-cluster mode, all on 127.0.0.1."""
import os
import sys


def ray_local_cluster(nodes=2):
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # every node on the loopback
    import ray
    from ray.cluster_utils import Cluster
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(nodes):
        cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, include_dashboard=False)
    cluster.wait_for_nodes()
    return cluster


def spark_local_session(master, app):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession
    builder = (SparkSession.builder.appName(app).master(master).config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.executor.memory", "512m"))
    if os.environ.get("PYTHONPATH"):
        builder = builder.config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
    return builder.getOrCreate()
