"""horovod.spark.torch's estimator over chorus: TorchEstimator.fit(df) trains a
PyTorch model on a Spark DataFrame with chorus.spark.run, TorchModel.transform(df)
applies it. The DataFrame goes to the Store as Parquet; each rank reads its share."""
from chorus.spark.torch.estimator import TorchEstimator, TorchModel

__all__ = ["TorchEstimator", "TorchModel"]
