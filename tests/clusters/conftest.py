"""Real Spark and Ray clusters on this machine, on the loopback only, for chorus.spark
and chorus.ray (in the torch 2 venv of scripts/torch2-venv.sh, which has both)."""
import glob
import os
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("CHORUS_BUILD_DIR", os.path.join(REPO, "build"))
PYTHON_DIR = os.path.join(BUILD, "python")
if PYTHON_DIR not in sys.path:
    sys.path.insert(0, PYTHON_DIR)
# Every process the engines start (executors, Python workers, raylets, actors)
# imports chorus from the build and stays on the loopback.
HERE = os.path.dirname(os.path.abspath(__file__))  # workers.py
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [PYTHON_DIR, HERE, os.environ.get("PYTHONPATH", "")] if p)
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
# Ray takes the loopback as every node's address only where it believes clusters unsupported.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("CHORUS_TIMEOUT_SECONDS", "20")


def spark_session(master):
    from pyspark.sql import SparkSession
    builder = SparkSession.builder
    if master.startswith("connect:"):
        builder = builder.remote(master[len("connect:"):])
    else:
        builder = (builder.master(master)
                   .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
                   .config("spark.ui.enabled", "false").config("spark.executor.memory", "512m")
                   .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
                   .config("spark.executorEnv.OMP_NUM_THREADS", "1"))
    spark = builder.appName("chorus-tests").getOrCreate()
    if not master.startswith("connect:"):
        spark.sparkContext.setLogLevel("ERROR")
    return spark


def _descends_from_us(pid):
    """Whether pid's ancestors include this process (the engines it started): other
    test files run beside this one and have rank processes of their own."""
    me = os.getpid()
    while pid > 1:
        if pid == me:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def rank_processes():
    """chorus rank processes (chorus.runner.child) of this test process's clusters alive now."""
    out = subprocess.run(["pgrep", "-f", "chorus.runner.child"], stdout=subprocess.PIPE, text=True).stdout
    return [int(p) for p in out.split() if _descends_from_us(int(p))]


def job_segments(prefix):
    return glob.glob(f"/dev/shm/chorus-{prefix}*")


def progress_of(path):
    """[(batch, size)] that rank 0 of workers.elastic_train committed so far."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [tuple(map(int, line.split())) for line in f if line.strip()]


def eventually(check, timeout=30.0):
    """check() until true (the engines end their processes asynchronously)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


@pytest.fixture(scope="module")
def ray_cluster():
    """A head (no CPUs, serving Ray Client) and two nodes of one CPU each, no dashboard."""
    import ray
    from ray.cluster_utils import Cluster
    import socket
    with socket.socket() as s:  # the head's Ray Client server, for ray:// drivers
        s.bind(("127.0.0.1", 0))
        client_port = s.getsockname()[1]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False,
                                                            "ray_client_server_port": client_port})
    cluster.client_address = f"ray://127.0.0.1:{client_port}"
    nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    cluster.wait_for_nodes()
    yield cluster, nodes
    ray.shutdown()
    cluster.shutdown()
