"""chorus.ray.ElasticRayExecutor: an elastic chorus job on Ray. The elastic driver is
chorusrun's own (src/rendezvous/elastic_rounds.h, through _core.ElasticDriver): here
its hosts are the Ray nodes alive now and its workers are actors, one per slot.
Workers train inside hvd.elastic.run; a node removed ends its workers, the others
roll back to the last commit and go on; a node added gets workers at the next commit."""
import os
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Optional, Set

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from chorus import _core
from chorus.ray import worker as _worker


@dataclass
class ElasticSettings:
    min_np: int = 1
    max_np: Optional[int] = None
    reset_limit: Optional[int] = None
    elastic_timeout: float = 600
    timeout_s: int = 30
    nics: Optional[Set[str]] = None
    verbose: int = 1
    discovery_interval: float = 1.0
    cooldown_range: Optional[tuple] = None
    ssh_identity_file: Optional[str] = None
    discovery: object = None  # a RayHostDiscovery (or one like it), with override_discovery=False


class RayHostDiscovery:
    """The hosts an elastic job may use: Ray's live nodes (told apart by node id), each
    with as many slots as its resources hold workers. Subclass it and override
    find_available_hosts_and_slots to choose hosts yourself (override_discovery=False)."""

    def __init__(self, use_gpu=False, cpus_per_slot=1, gpus_per_slot=1):
        self.use_gpu = use_gpu
        self.cpus_per_slot = cpus_per_slot
        self.gpus_per_slot = gpus_per_slot

    def find_available_hosts_and_slots(self):
        """{host: slots} of the nodes alive now."""
        hosts = {}
        for node in ray.nodes():
            if not node.get("Alive"):
                continue
            res = node.get("Resources", {})
            slots = int(res.get("CPU", 0) // self.cpus_per_slot) if self.cpus_per_slot else 1 << 20
            if self.use_gpu:
                slots = min(slots, int(res.get("GPU", 0) // (self.gpus_per_slot or 1)))
            if slots > 0:
                hosts[node["NodeID"]] = slots
        return hosts


class _ElasticWorker:
    def ready(self):
        return os.getpid()

    def run(self, env, fn, args, kwargs):
        _worker.set_env(env)
        try:
            value = fn(*args, **kwargs)
            rank = _core.rank() if _core.is_initialized() else -1
            return rank, value
        finally:
            _worker.end_job()


class ElasticRayExecutor:
    """horovod.ray.ElasticRayExecutor's surface over chorus's elastic driver."""

    @staticmethod
    def create_settings(min_np=1, max_np=None, reset_limit=None, elastic_timeout=600, timeout_s=30,
                        ssh_identity_file=None, nics=None, verbose=1, discovery_interval=1.0, cooldown_range=None,
                        **unused):
        """ssh_identity_file: accepted for Horovod's signature (Ray reaches the workers)."""
        return ElasticSettings(min_np, max_np, reset_limit, elastic_timeout, timeout_s, nics, verbose,
                               discovery_interval, cooldown_range, ssh_identity_file)

    def __init__(self, settings=None, use_gpu=False, cpus_per_slot=1, gpus_per_slot=None, env_vars=None,
                 override_discovery=True, min_workers=None, max_workers=None, cpus_per_worker=None,
                 gpus_per_worker=None, reset_limit=None, elastic_timeout=None, cooldown_range=None):
        self.settings = settings or ElasticSettings()
        # Horovod's newer keyword names win over the settings' older ones.
        if min_workers is not None:
            self.settings.min_np = min_workers
        if max_workers is not None:
            self.settings.max_np = max_workers
        if reset_limit is not None:
            self.settings.reset_limit = reset_limit
        if elastic_timeout is not None:
            self.settings.elastic_timeout = elastic_timeout
        if cooldown_range is not None:
            self.settings.cooldown_range = cooldown_range
        self.cpus = cpus_per_worker if cpus_per_worker is not None else cpus_per_slot
        gpus = gpus_per_worker if gpus_per_worker is not None else gpus_per_slot
        if gpus and not use_gpu:
            raise ValueError("ElasticRayExecutor: gpus_per_worker needs use_gpu=True")
        self.gpus = (gpus or 1) if use_gpu else 0
        if self.settings.min_np < 1 or (self.settings.max_np is not None and self.settings.max_np < self.settings.min_np):
            raise ValueError(f"ElasticRayExecutor: min_np={self.settings.min_np} and max_np={self.settings.max_np} "
                             "must satisfy 1 <= min_np <= max_np")
        if override_discovery:
            self.discovery = RayHostDiscovery(use_gpu, self.cpus, self.gpus)
        elif self.settings.discovery is None:
            raise ValueError("ElasticRayExecutor: override_discovery=False needs settings.discovery (a "
                             "RayHostDiscovery whose find_available_hosts_and_slots() chooses the hosts)")
        else:
            self.discovery = self.settings.discovery
        self.env_vars = {k: str(v) for k, v in (env_vars or {}).items()}
        self._started = False
        self._workers = {}  # handle -> (actor, ref, node)
        self._next = 0

    def start(self):
        if not ray.is_initialized():
            raise RuntimeError("ElasticRayExecutor.start(): call ray.init() first")
        self._started = True

    # -- the driver's pool -------------------------------------------------------------

    def _discover(self):
        return [(host, int(slots)) for host, slots in self.discovery.find_available_hosts_and_slots().items()]

    def _start(self, worker_id, node, slot, env):
        actor = ray.remote(_ElasticWorker).options(
            num_cpus=self.cpus, num_gpus=self.gpus,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
        full = dict(env)
        full.update({"CHORUS_HOSTNAME": node, "CHORUS_JOB_ID": self._job_id,
                     "CHORUS_START_TIMEOUT": str(int(self.settings.timeout_s))})
        if self.settings.nics:
            full["CHORUS_IFACE"] = sorted(self.settings.nics)[0]
        full.update(self.env_vars)
        ready = actor.ready.remote()  # answers once Ray has placed and started the actor
        ref = actor.run.remote(full, self._fn, self._args, self._kwargs)
        handle = self._next
        self._next += 1
        self._workers[handle] = (actor, ref, node)
        self._pending[handle] = (ready, time.monotonic() + self.settings.timeout_s)
        return handle

    def _stop(self, handle):
        actor, _, _ = self._workers[handle]
        ray.kill(actor)

    def _stop_all(self):
        for actor, _, _ in self._workers.values():
            ray.kill(actor)

    def _log(self, line):
        if self.settings.verbose:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    def _unplaced(self):
        """Workers Ray has not started within timeout_s (a node whose CPUs other jobs
        hold): failed, so that the driver does not wait for them."""
        ended = []
        for handle, (ready, deadline) in list(self._pending.items()):
            if ray.wait([ready], timeout=0)[0]:
                del self._pending[handle]
            elif time.monotonic() > deadline and handle not in self._done:
                del self._pending[handle]
                self._done.add(handle)
                ray.kill(self._workers[handle][0])
                ended.append((handle, False, f"was not started by Ray within timeout_s={self.settings.timeout_s}"))
        return ended

    def _ended(self, results):
        ended = self._unplaced()
        refs = {ref: h for h, (_, ref, _) in self._workers.items() if h not in self._done}
        if not refs:
            return ended
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0.05)
        for ref in ready:
            handle = refs[ref]
            self._done.add(handle)
            try:
                results.append(ray.get(ref))
                ended.append((handle, True, "exited with code 0"))
            except ray.exceptions.RayActorError as e:
                ended.append((handle, False, f"died ({str(e).splitlines()[0]})"))
            except ray.exceptions.RayTaskError as e:
                lines = [line for line in str(e).splitlines() if line.strip()]
                ended.append((handle, False, f"failed: {lines[-1] if lines else e}"))
            ray.kill(self._workers[handle][0])  # its run is over: the slot is free
        return ended

    # -- running -------------------------------------------------------------------------

    def run(self, worker_fn, callbacks=None, args=(), kwargs=None):
        """Runs worker_fn on every worker until the job ends; returns the values of the
        workers that finished, in their last ranks' order. Raises when the job fails."""
        if not self._started:
            raise RuntimeError("ElasticRayExecutor: call start() first")
        self._fn, self._args, self._kwargs = worker_fn, tuple(args), dict(kwargs or {})
        self._job_id = "rayelastic-" + uuid.uuid4().hex[:12]
        self._workers, self._done, self._next, self._pending = {}, set(), 0, {}
        s = self.settings
        cooldown = s.cooldown_range or (0.0, 0.0)
        driver = _core.ElasticDriver(
            discover=self._discover, start=self._start, stop=self._stop, stop_all=self._stop_all,
            min_np=s.min_np, max_np=s.max_np or 0, reset_limit=-1 if s.reset_limit is None else s.reset_limit,
            cooldown_min=float(cooldown[0]), cooldown_max=float(cooldown[1]), elastic_timeout=float(s.elastic_timeout),
            discovery_interval=float(s.discovery_interval), bind="0.0.0.0",
            advertised=ray.util.get_node_ip_address(), name="chorus.ray", log=self._log,
            words={"min_np": "min_np", "reset_limit": "reset_limit", "elastic_timeout": "elastic_timeout"})
        results = []
        try:
            driver.begin()
            while True:
                code = driver.step(self._ended(results))
                if code is not None:
                    break
        finally:
            self._stop_all()
            nodes = {node for _, _, node in self._workers.values()}
            cleanup = ray.remote(num_cpus=0)(_worker.remove_segments)
            alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
            refs = [cleanup.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=True))
                    .remote(self._job_id) for n in nodes & alive]
            ray.wait(refs, num_returns=len(refs), timeout=30)
        if code != 0:
            raise RuntimeError(f"chorus.ray: the elastic job failed: {driver.failure}")
        return [value for _, value in sorted(results, key=lambda r: r[0])]
