"""A Horovod-on-Spark estimator program, with only the imports naming chorus: a
libsvm file of 28x28 images is read into a DataFrame, labels are one-hot encoded,
a TorchEstimator trains a small CNN on Spark executors and the fitted TorchModel
labels a held-out split. The images are synthetic (no download): each class is a
bright bar at its own place, under noise.

    python examples/spark/pytorch_spark_mnist.py --master local[2]
"""
import argparse
import os
import sys
import tempfile

import numpy as np
import pyspark.sql.types as T
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from pyspark.ml.evaluation import MulticlassClassificationEvaluator
from pyspark.ml.feature import OneHotEncoder
from pyspark.sql.functions import udf

import chorus.spark.torch as hvd                       # was: import horovod.spark.torch as hvd
from chorus.spark.common.backend import SparkBackend   # was: from horovod.spark.common.backend import SparkBackend
from chorus.spark.common.store import Store            # was: from horovod.spark.common.store import Store

parser = argparse.ArgumentParser(description="PyTorch Spark estimator on synthetic digits")
parser.add_argument("--master", default="local[2]")
parser.add_argument("--num-proc", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--samples", type=int, default=3000)
parser.add_argument("--work-dir", default=None, help="the Store's folder (default: a temporary one)")


def write_libsvm(path, n, seed=0):
    """n synthetic 28x28 digits in libsvm format (label, then 1-based index:value pairs)."""
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for _ in range(n):
            label = int(rng.integers(0, 10))
            img = rng.uniform(0, 0.3, size=(28, 28))
            row, col = divmod(label, 5)
            img[4 + row * 12:10 + row * 12, 2 + col * 5:6 + col * 5] += 0.7
            pairs = " ".join(f"{i + 1}:{v:.3f}" for i, v in enumerate(img.ravel()) if v > 0.05)
            f.write(f"{label} {pairs}\n")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, kernel_size=5)
        self.conv2 = nn.Conv2d(8, 16, kernel_size=5)
        self.fc1 = nn.Linear(256, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, features):
        x = features.float()
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = F.relu(self.fc1(x.flatten(1)))
        return F.log_softmax(self.fc2(x), dim=1)


if __name__ == "__main__":
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from cluster_local import spark_local_session
    spark = spark_local_session(args.master, "pytorch_spark_mnist")

    work = args.work_dir or tempfile.mkdtemp(prefix="chorus-spark-mnist-")
    store = Store.create(work)
    libsvm_path = os.path.join(work, "digits.libsvm")
    write_libsvm(libsvm_path, args.samples)
    df = spark.read.format("libsvm").option("numFeatures", "784").load(libsvm_path)
    encoder = OneHotEncoder(inputCols=["label"], outputCols=["label_vec"], dropLast=False)
    train_df = encoder.fit(df).transform(df)
    train_df, test_df = train_df.randomSplit([0.9, 0.1], seed=1)

    torch.manual_seed(0)
    model = Net()
    optimizer = optim.Adam(model.parameters(), lr=0.003)
    loss = nn.NLLLoss()
    backend = SparkBackend(num_proc=args.num_proc, stdout=sys.stdout, stderr=sys.stderr,
                           prefix_output_with_timestamp=True)
    estimator = hvd.TorchEstimator(backend=backend, store=store, model=model, optimizer=optimizer,
                                   loss=lambda input, target: loss(input, target.long()),
                                   input_shapes=[[-1, 1, 28, 28]], feature_cols=["features"], label_cols=["label"],
                                   batch_size=args.batch_size, epochs=args.epochs, validation=0.1, verbose=1)
    torch_model = estimator.fit(train_df).setOutputCols(["label_prob"])

    pred_df = torch_model.transform(test_df)
    argmax = udf(lambda v: float(np.argmax(v)), returnType=T.DoubleType())
    pred_df = pred_df.withColumn("label_pred", argmax(pred_df.label_prob))
    evaluator = MulticlassClassificationEvaluator(predictionCol="label_pred", labelCol="label", metricName="accuracy")
    accuracy = evaluator.evaluate(pred_df)
    print("Test accuracy:", accuracy)
    assert accuracy > 0.8, accuracy
    spark.stop()
