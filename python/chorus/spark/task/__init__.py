"""What a rank started by chorus.spark can ask about its Spark task."""
import os


def get_available_devices():
    """The addresses of the GPUs Spark gave this rank's task (its "gpu" resource), as
    horovod.spark.task.get_available_devices; empty when it was given none."""
    value = os.environ.get("CHORUS_SPARK_DEVICES", "")
    return [d for d in value.split(",") if d]


__all__ = ["get_available_devices"]
