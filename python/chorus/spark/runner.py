"""chorus.spark.run: one Spark barrier task per rank, each running the function in
a child process (chorus.runner) with chorus's variables; rank 0's child serves the
rendezvous store on a port its task holds, with a secret made for this job."""
import os
import sys
import threading
import time
import uuid

from chorus import _core
from chorus.runner.rank_process import RankProcess, load_value, rank_env, remove_segments
from chorus.spark.job import _PICKLER, _check_controller, _driver_host, _is_connect, _session, _write_output

class SparkJobError(RuntimeError):
    """A rank of a chorus.spark job failed; .rank, .traceback say which and where."""

    def __init__(self, rank, message, traceback_text, job_id=""):
        super().__init__(f"chorus.spark: rank {rank} failed: {message}\n{traceback_text}".rstrip())
        self.rank = rank
        self.traceback = traceback_text
        self.job_id = job_id


def _slots(sc):
    """Tasks the cluster can run at once now (executors registered so far)."""
    jsc = sc._jsc.sc()
    profile = jsc.resourceProfileManager().defaultResourceProfile()
    return int(jsc.maxNumConcurrentTasks(profile))


def _wait_for_slots(sc, num_proc, timeout):
    deadline = time.monotonic() + timeout
    while True:
        have = _slots(sc)
        if have >= num_proc:
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"chorus.spark.run: num_proc={num_proc} needs {num_proc} task slots at once (one barrier task per "
                f"rank), but the cluster offered {have} within start_timeout={timeout:g} s; lower num_proc or add "
                "executors/cores")
        time.sleep(0.2)


def _make_task(payload, num_proc, job_id, env, start_timeout, executable, report, capture, pickler):
    """The barrier task's body (pickled to the executors)."""

    def task(_rows):
        from pyspark import BarrierTaskContext
        from chorus import _core as core

        ctx = BarrierTaskContext.get()
        rank = ctx.partitionId()
        hosts = [info.address.rsplit(":", 1)[0] for info in ctx.getTaskInfos()]
        held = None
        mine = ""
        if rank == 0:
            held = core.hold_free_port()
            mine = f"{held.port} {core.generate_secret()}"
        agreed = ctx.allGather(mine)
        port, secret = agreed[0].split()
        devices = []
        try:
            gpu = ctx.resources().get("gpu")
            devices = list(gpu.addresses) if gpu else []
        except Exception:  # noqa: BLE001 - no resources API or none assigned
            pass
        extra = dict(env)
        extra.update({"CHORUS_START_TIMEOUT": str(int(start_timeout)), "CHORUS_SPARK_DEVICES": ",".join(devices)})
        child_env = rank_env(rank, num_proc, hosts, (hosts[0], int(port)), secret, job_id, extra)
        fn, args, kwargs = payload
        proc = RankProcess(fn, args, kwargs, child_env, pickler, executable=executable, capture=capture)
        try:
            record = proc.wait()
        finally:
            out, err = proc.output()
            proc.close()
            if held is not None:
                held.release()
        if not record["ok"] and report:
            try:
                client = core.StoreClient(report[0], report[1], report[2], 10.0)
                client.set(f"failed/{rank}", record["error"] + "\n" + record.get("traceback", ""))
                client.add("failures", 1)
            except Exception:  # noqa: BLE001 - the driver still gets the record with the job's result
                pass
        # Every rank's process has ended: what the job left in this host's shared memory goes.
        ctx.barrier()
        remove_segments(job_id)
        record["stdout"], record["stderr"] = out, err
        yield rank, record

    return task


def run(fn, args=(), kwargs={}, num_proc=None, start_timeout=None, env=None, stdout=None, stderr=None,  # noqa: B006
        verbose=1, nics=None, prefix_output_with_timestamp=False, executable=None, use_mpi=None, use_gloo=None,
        extra_mpi_args=None):
    """Runs fn(*args, **kwargs) on num_proc ranks, one Spark barrier task each, and
    returns every rank's return value in rank order (horovod.spark.run's contract).

    A rank's exception fails run() here with that rank's message and traceback; the
    job group is cancelled and no rank process or shared memory is left behind."""
    _check_controller(use_mpi, use_gloo, extra_mpi_args)
    spark = _session()
    connect = _is_connect(spark)
    if start_timeout is None:
        start_timeout = int(os.environ.get("HOROVOD_SPARK_START_TIMEOUT", os.environ.get("CHORUS_START_TIMEOUT", 600)))
    if num_proc is None:
        num_proc = int(spark.conf.get("spark.default.parallelism", "0") or 0) if connect else \
            spark.sparkContext.defaultParallelism
    if not isinstance(num_proc, int) or num_proc < 1:
        raise ValueError(f"chorus.spark.run: num_proc={num_proc!r} must be a positive integer")
    job_env = {k: str(v) for k, v in (env or {}).items()}
    if nics:
        nics = sorted(nics) if not isinstance(nics, str) else [nics]
        job_env["CHORUS_IFACE"] = nics[0]
    job_id = "spark-" + uuid.uuid4().hex[:12]
    capture = True
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    if verbose >= 2:
        print(f"chorus.spark.run: job {job_id}, {num_proc} ranks", file=stderr)

    report_server = None
    report = None
    sc = None
    if not connect:
        sc = spark.sparkContext
        _wait_for_slots(sc, num_proc, start_timeout)
        secret = _core.generate_secret()
        host = _driver_host(spark)
        report_server = _core.StoreServer(host, 0, secret)
        report = (host, report_server.port, secret)
    task = _make_task((fn, tuple(args), dict(kwargs)), num_proc, job_id, job_env, start_timeout, executable,
                      report, capture, _PICKLER)
    group = f"chorus.spark.run-{job_id}"
    outcome = {}

    def go():
        try:
            if connect:
                outcome["records"] = _run_connect(spark, task, num_proc, group)
            else:
                sc.setJobGroup(group, f"chorus.spark.run: {num_proc} ranks", interruptOnCancel=True)
                rdd = sc.parallelize(range(num_proc), num_proc)
                outcome["records"] = rdd.barrier().mapPartitions(task).collect()
        except BaseException as e:  # noqa: BLE001 - raised on the caller's thread
            outcome["error"] = e

    thread = threading.Thread(target=go, name="chorus-spark-job", daemon=True)
    thread.start()
    failed = None
    try:
        client = _core.StoreClient(report[0], report[1], report[2], 10.0) if report else None
        while thread.is_alive():
            thread.join(0.2)
            if client is not None and failed is None and client.check("failures"):
                failed = _first_failure(client, num_proc)
                sc.cancelJobGroup(group)  # the others stop now, not at their own timeouts
    except BaseException:
        _cancel(spark, sc, group)  # interrupted (Ctrl-C): the ranks stop with it
        raise
    finally:
        thread.join()
        if report_server is not None:
            report_server.close()
    records = sorted(outcome.get("records", []), key=lambda r: r[0])
    _write_output(records, stdout, stderr, prefix_output_with_timestamp)
    errors = [(r["time"], rank, r) for rank, r in records if not r["ok"]]
    if errors:
        _, rank, r = min(errors, key=lambda e: (e[0], e[1]))
        raise SparkJobError(rank, r["error"], r.get("traceback", ""), job_id)
    if failed is not None:
        rank, message = failed
        message, _, tb = message.partition("\n")
        raise SparkJobError(rank, message, tb + "(the job was cancelled: its other ranks were stopped)", job_id)
    if "error" in outcome:
        raise outcome["error"]
    if len(records) != num_proc:
        raise RuntimeError(f"chorus.spark.run: {len(records)} of {num_proc} ranks reported back")
    return [load_value(r, _PICKLER) for _, r in records]


def _cancel(spark, sc, group):
    try:
        if sc is not None:
            sc.cancelJobGroup(group)
        else:
            spark.interruptTag(group)
    except Exception:  # noqa: BLE001 - best effort while an exception is on its way
        pass


def _first_failure(client, num_proc):
    for rank in range(num_proc):
        if client.check(f"failed/{rank}"):
            return rank, client.get(f"failed/{rank}", 5.0).decode(errors="replace")
    return -1, "a rank failed"


def _run_connect(spark, task, num_proc, group):
    """Spark Connect has no SparkContext: the same barrier tasks through mapInArrow."""
    import pyarrow as pa

    def arrow_task(batches):
        for _ in batches:
            pass
        for rank, record in task(iter(())):
            yield pa.RecordBatch.from_arrays([pa.array([rank], pa.int32()), pa.array([_dumps(record)], pa.binary())],
                                             names=["rank", "record"])

    spark.addTag(group)
    try:
        df = spark.range(0, num_proc, 1, num_proc).mapInArrow(arrow_task, "rank int, record binary", barrier=True)
        rows = df.collect()
    finally:
        spark.removeTag(group)
    import pickle
    return [(row["rank"], pickle.loads(row["record"])) for row in rows]


def _dumps(record):
    import pickle
    return pickle.dumps(record)
