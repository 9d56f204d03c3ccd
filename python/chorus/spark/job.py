"""What chorus.spark's runners (run, run_elastic) share: the Spark session, the driver's
host, the controller arguments Horovod's runners take, and the ranks' output."""
import datetime
import socket

_PICKLER = "pyspark.cloudpickle"


def _check_controller(use_mpi, use_gloo, extra_mpi_args):
    if use_mpi:
        raise ValueError("chorus.spark.run: use_mpi=True cannot be honoured: the ranks are Spark barrier tasks, "
                         "not processes mpirun starts; chorus's own TCP and shared-memory data path (what "
                         "use_gloo=True chose in Horovod) carries the job. Leave use_mpi unset.")
    if use_gloo is False:
        raise ValueError("chorus.spark.run: use_gloo=False leaves no controller (MPI is not available under "
                         "Spark tasks); leave it unset or True")
    if extra_mpi_args:
        raise ValueError(f"chorus.spark.run: extra_mpi_args={extra_mpi_args!r} has no mpirun to go to")


def _session():
    from pyspark.sql import SparkSession
    spark = SparkSession.getActiveSession()
    if spark is None:
        spark = SparkSession.builder.getOrCreate()
    return spark


def _is_connect(spark):
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _driver_host(spark):
    try:
        return spark.sparkContext.getConf().get("spark.driver.host") or socket.gethostname()
    except Exception:  # noqa: BLE001
        return socket.gethostname()


def _write_output(records, stdout, stderr, prefix_timestamp):
    for rank, record in records:
        for text, stream, name in ((record.get("stdout", ""), stdout, "stdout"),
                                   (record.get("stderr", ""), stderr, "stderr")):
            for line in text.splitlines():
                stamp = datetime.datetime.now().strftime("%a %b %d %H:%M:%S %Y") + ":" if prefix_timestamp else ""
                stream.write(f"[{rank}]<{name}>:{stamp}{line}\n")
        stdout.flush()
