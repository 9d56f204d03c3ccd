"""The Ray and Spark examples train from one command each on loopback clusters."""
import os
import re
import subprocess
import sys

from conftest import REPO


def run_example(*argv, timeout=600):
    proc = subprocess.run([sys.executable, *argv], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout[-8000:]
    return proc.stdout


def test_elastic_ray_example_trains():
    out = run_example("examples/ray/pytorch_ray_elastic.py", "--local-cluster", "--epochs", "3")
    assert re.search(r"epoch 2: loss [0-9.]+ on 2 workers", out), out[-4000:]


def test_spark_run_example_trains_on_a_local_cluster():
    out = run_example("examples/spark/pytorch_spark_run.py", "--master", "local-cluster[2,1,1024]")
    assert "ranks [0, 1], replicas equal: True" in out, out[-4000:]


def test_spark_estimator_example_trains():
    out = run_example("examples/spark/pytorch_spark_mnist.py", "--master", "local[2]")
    accuracy = float(re.search(r"Test accuracy: ([0-9.]+)", out).group(1))
    assert accuracy > 0.8, out[-4000:]
