"""chorus.spark.torch.TorchEstimator on local[2]: fit on a DataFrame, transform another."""
import numpy as np
import pytest
import torch

from conftest import spark_session


@pytest.fixture(scope="module")
def spark():
    session = spark_session("local[2]")
    yield session
    session.stop()


def blobs(spark, n, seed):
    """Four Gaussian blobs in 8 dimensions, as a features vector and a label column."""
    from pyspark.ml.linalg import Vectors
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 3, size=(4, 8))
    labels = rng.integers(0, 4, size=n)
    points = centers[labels] + rng.normal(0, 0.7, size=(n, 8))
    return spark.createDataFrame([(Vectors.dense(p.tolist()), float(l)) for p, l in zip(points, labels)],
                                 ["features", "label"])


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return torch.log_softmax(self.fc2(torch.relu(self.fc1(x))), dim=1)


def nll(output, target):
    return torch.nn.functional.nll_loss(output, target.long())


def test_fit_then_transform(spark, tmp_path):
    from chorus.spark.common.backend import SparkBackend
    from chorus.spark.common.store import Store
    from chorus.spark.torch import TorchEstimator
    torch.manual_seed(0)
    model = Net()
    estimator = TorchEstimator(backend=SparkBackend(num_proc=2), store=Store.create(str(tmp_path / "store")),
                               model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5),
                               loss=nll, input_shapes=[[-1, 8]], feature_cols=["features"], label_cols=["label"],
                               batch_size=32, epochs=6, validation=0.1, verbose=1)
    fitted = estimator.fit(blobs(spark, 2000, seed=1)).setOutputCols(["label_prob"])
    history = fitted.getHistory()
    assert len(history["train_loss"]) == 6 and history["train_loss"][-1] < history["train_loss"][0] / 2, history
    assert len(history["val_loss"]) == 6
    test = blobs(spark, 400, seed=1)  # the same blobs, new draws
    rows = fitted.transform(test).select("label", "label_prob").collect()
    accuracy = np.mean([float(np.argmax(r["label_prob"])) == r["label"] for r in rows])
    assert accuracy > 0.9, accuracy
    # The checkpoint in the store is the fitted model's weights.
    state = torch.load(tmp_path / "store" / "runs" / fitted.run_id / "checkpoint")
    assert all(torch.equal(state[k], v) for k, v in fitted.getModel().state_dict().items())


def test_missing_columns_are_named(spark, tmp_path):
    from chorus.spark.common.store import Store
    from chorus.spark.torch import TorchEstimator
    model = Net()
    estimator = TorchEstimator(num_proc=2, store=Store.create(str(tmp_path)), model=model,
                               optimizer=torch.optim.SGD(model.parameters(), lr=0.1), loss=nll,
                               feature_cols=["pixels"], label_cols=["label"])
    with pytest.raises(ValueError, match=r"no column\(s\) \['pixels'\]"):
        estimator.fit(blobs(spark, 10, seed=0))
