"""chorus.spark.run_elastic: an elastic chorus job on Spark executors, run by the
elastic driver chorusrun and chorus.ray use (_core.ElasticDriver).

The Spark job is one long task per possible worker (max_num_proc of them, not a
barrier stage: tasks of executors that are lost are run again elsewhere). Each task
registers with the driver's store as a slot on its host and, when the driver asks,
runs a worker (a child process, as chorus.spark.run's ranks) and reports its end.
The driver's hosts are the hosts of the live slots; a lost executor's slots go quiet,
their workers count as failed, and the others roll back to the last commit."""
import json
import os
import socket
import sys
import threading
import time
import uuid

from chorus import _core
from chorus.runner.rank_process import RankProcess, load_value, remove_segments
from chorus.spark.job import _PICKLER, _check_controller, _driver_host, _is_connect, _session, _write_output

_BEAT_SECONDS = 1.0
_LOST_AFTER = 20.0  # a slot silent this long is lost (its executor is gone; a loaded host still beats)


def _with_rank(fn, *args, **kwargs):
    value = fn(*args, **kwargs)
    rank = _core.rank() if _core.is_initialized() else -1
    return rank, value


def _slot_task(store, payload, job_id, start_timeout, executable):
    """The body of every Spark task: one slot of the elastic job."""

    def task(index, _rows):
        from pyspark import TaskContext
        from chorus import _core as core
        attempt = TaskContext.get().attemptNumber()
        key = f"{index}.{attempt}"
        host = socket.gethostname()
        client = core.StoreClient(store[0], store[1], store[2], 30.0)
        n = client.add("spark/nslots", 1)
        client.set(f"spark/slot/{n}", json.dumps({"key": key, "host": host}))
        records, gen, proc = [], 0, None
        fn, args, kwargs = payload
        last_beat = 0.0
        while not client.check("spark/done"):
            now = time.monotonic()
            if now - last_beat >= _BEAT_SECONDS:
                client.set(f"spark/beat/{key}", str(time.time()))
                last_beat = now
            if proc is None and client.check(f"spark/start/{key}/{gen}"):
                env = json.loads(client.get(f"spark/start/{key}/{gen}", 10.0))
                env.update({"CHORUS_HOSTNAME": host, "CHORUS_JOB_ID": job_id,
                            "CHORUS_START_TIMEOUT": str(int(start_timeout))})
                proc = RankProcess(_with_rank, (fn,) + tuple(args), kwargs, env, _PICKLER, executable=executable,
                                   capture=True)
            if proc is not None:
                if client.check(f"spark/stop/{key}/{gen}"):
                    proc.kill()
                record = proc.wait(0.2)
                if record is not None:
                    record["stdout"], record["stderr"] = proc.output()
                    proc.close()
                    proc = None
                    client.set(f"spark/end/{key}/{gen}", json.dumps(
                        {"ok": record["ok"], "what": "exited with code 0" if record["ok"] else record["error"]}))
                    records.append(record)
                    gen += 1
            else:
                time.sleep(0.2)
        if proc is not None:
            proc.close()
        remove_segments(job_id)  # the job is over: no worker of it runs any more
        for record in records:
            yield record

    return task


class _SlotPool:
    """The elastic driver's workers as Spark task slots (through the driver's store)."""

    def __init__(self, client, verbose, extra_env):
        self.client = client
        self.extra_env = extra_env
        self.verbose = verbose
        self.slots = {}    # key -> {"host", "beat", "seen", "busy"}
        self.seen_n = 0
        self.workers = {}  # handle -> (key, gen)
        self.gens = {}     # key -> next generation
        self.ended = set()
        self.driver = None

    def refresh(self):
        n = self.client.add("spark/nslots", 0)
        for i in range(self.seen_n + 1, n + 1):
            slot = json.loads(self.client.get(f"spark/slot/{i}", 10.0))
            self.slots[slot["key"]] = {"host": slot["host"], "beat": None, "seen": time.monotonic(), "busy": None}
        self.seen_n = max(self.seen_n, n)
        now = time.monotonic()
        for key, s in self.slots.items():
            if self.client.check(f"spark/beat/{key}"):
                beat = self.client.get(f"spark/beat/{key}", 5.0)
                if beat != s["beat"]:
                    s["beat"], s["seen"] = beat, now

    def alive(self, key):
        return time.monotonic() - self.slots[key]["seen"] < _LOST_AFTER

    def discover(self):
        self.refresh()
        hosts = {}
        for key, s in self.slots.items():
            if self.alive(key):
                hosts[s["host"]] = hosts.get(s["host"], 0) + 1
        return sorted(hosts.items())

    def start(self, worker_id, host, slot, env):
        key = next(k for k, s in sorted(self.slots.items())
                   if s["host"] == host and s["busy"] is None and self.alive(k))
        gen = self.gens.get(key, 0)
        self.gens[key] = gen + 1
        handle = len(self.workers)
        self.workers[handle] = (key, gen)
        self.slots[key]["busy"] = handle
        full = dict(env)
        full.update(self.driver.store_environment())
        full.update(self.extra_env)
        self.client.set(f"spark/start/{key}/{gen}", json.dumps(full))
        return handle

    def stop(self, handle):
        key, gen = self.workers[handle]
        self.client.set(f"spark/stop/{key}/{gen}", "1")

    def stop_all(self):
        for handle in self.workers:
            if handle not in self.ended:
                self.stop(handle)

    def log(self, line):
        if self.verbose:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    def poll_ended(self):
        self.refresh()
        out = []
        for handle, (key, gen) in self.workers.items():
            if handle in self.ended:
                continue
            if self.client.check(f"spark/end/{key}/{gen}"):
                end = json.loads(self.client.get(f"spark/end/{key}/{gen}", 5.0))
                out.append((handle, end["ok"], end["what"]))
            elif not self.alive(key):
                out.append((handle, False, f"was lost with its Spark task {key} (no heartbeat for {_LOST_AFTER:g} s)"))
            else:
                continue
            self.ended.add(handle)
            self.slots[key]["busy"] = None
        return out


def run_elastic(fn, args=(), kwargs={}, num_proc=None, min_num_proc=None, max_num_proc=None,  # noqa: B006
                start_timeout=None, elastic_timeout=None, reset_limit=None, env=None, stdout=None, stderr=None,
                verbose=1, nics=None, prefix_output_with_timestamp=False, min_np=None, max_np=None,
                executable=None, cooldown_range=None):
    """horovod.spark.run_elastic: fn (which uses hvd.elastic.run) on between
    min_num_proc and max_num_proc workers as Spark's executors come and go; returns
    the values of the workers that finished, in their last ranks' order."""
    _check_controller(None, None, None)
    spark = _session()
    if _is_connect(spark):
        raise ValueError("chorus.spark.run_elastic needs a SparkContext (classic Spark): its driver serves the "
                         "elastic store the executors reach; Spark Connect's client may not be reachable")
    sc = spark.sparkContext
    min_num_proc = min_num_proc if min_num_proc is not None else min_np
    max_num_proc = max_num_proc if max_num_proc is not None else max_np
    num_proc = num_proc or min_num_proc or sc.defaultParallelism
    min_num_proc = min_num_proc or num_proc
    max_num_proc = max_num_proc or num_proc
    if not 1 <= min_num_proc <= num_proc <= max_num_proc:
        raise ValueError(f"chorus.spark.run_elastic: needs 1 <= min_num_proc ({min_num_proc}) <= num_proc "
                         f"({num_proc}) <= max_num_proc ({max_num_proc})")
    if start_timeout is None:
        start_timeout = int(os.environ.get("HOROVOD_SPARK_START_TIMEOUT", 600))
    if elastic_timeout is None:
        elastic_timeout = float(os.environ.get("HOROVOD_ELASTIC_TIMEOUT", 600))
    job_env = {k: str(v) for k, v in (env or {}).items()}
    if nics:
        job_env["CHORUS_IFACE"] = sorted(nics)[0] if not isinstance(nics, str) else nics
    job_id = "sparkelastic-" + uuid.uuid4().hex[:12]
    host = _driver_host(spark)
    pool = _SlotPool(None, verbose, job_env)
    cooldown = cooldown_range or (0.0, 0.0)
    driver = _core.ElasticDriver(
        discover=pool.discover, start=pool.start, stop=pool.stop, stop_all=pool.stop_all, min_np=min_num_proc,
        max_np=max_num_proc, initial_np=num_proc, reset_limit=-1 if reset_limit is None else reset_limit,
        cooldown_min=float(cooldown[0]), cooldown_max=float(cooldown[1]), elastic_timeout=float(elastic_timeout),
        bind=host, advertised=host, name="chorus.spark", log=pool.log,
        words={"min_np": "min_num_proc", "reset_limit": "reset_limit", "elastic_timeout": "elastic_timeout"})
    pool.driver = driver
    store = (driver.store_addr, driver.store_port, driver.secret)
    pool.client = _core.StoreClient(*store, 10.0)
    payload = (fn, tuple(args), dict(kwargs))
    task = _slot_task(store, payload, job_id, start_timeout, executable)
    group = f"chorus.spark.run_elastic-{job_id}"
    outcome = {}

    def go():
        try:
            sc.setJobGroup(group, f"chorus.spark.run_elastic: up to {max_num_proc} workers", interruptOnCancel=True)
            outcome["records"] = sc.parallelize(range(max_num_proc), max_num_proc) \
                .mapPartitionsWithIndex(task).collect()
        except BaseException as e:  # noqa: BLE001 - raised below
            outcome["error"] = e

    thread = threading.Thread(target=go, name="chorus-spark-elastic", daemon=True)
    thread.start()
    code = None
    try:
        deadline = time.monotonic() + start_timeout
        while sum(n for _, n in pool.discover()) < min_num_proc:
            if time.monotonic() > deadline or not thread.is_alive():
                raise TimeoutError(f"chorus.spark.run_elastic: {sum(n for _, n in pool.discover())} task slots "
                                   f"started within start_timeout={start_timeout:g} s, fewer than min_num_proc="
                                   f"{min_num_proc}")
            time.sleep(0.2)
        driver.begin()
        while code is None:
            code = driver.step(pool.poll_ended())
            time.sleep(0.05)
    except BaseException:
        sc.cancelJobGroup(group)  # interrupted, or no start: the tasks stop with it
        raise
    finally:
        pool.client.set("spark/done", "1")
        thread.join(60)
        if thread.is_alive():
            sc.cancelJobGroup(group)
            thread.join()
        failure = driver.failure
        pool.driver = None  # the driver holds the pool's methods: break the cycle,
        driver.close()      # and stop its store now
    records = outcome.get("records", [])
    _write_output([(i, r) for i, r in enumerate(records)], stdout or sys.stdout, stderr or sys.stderr,
                  prefix_output_with_timestamp)
    if code != 0:
        failed = [r for r in records if not r["ok"]]
        detail = f"\n{failed[-1]['error']}\n{failed[-1].get('traceback', '')}" if failed else ""
        raise RuntimeError(f"chorus.spark.run_elastic: the elastic job failed: {failure}{detail}")
    if "error" in outcome:
        raise outcome["error"]
    values = [load_value(r, _PICKLER) for r in records if r["ok"]]
    return [value for _, value in sorted(values, key=lambda rv: rv[0])]
