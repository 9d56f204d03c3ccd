"""chorus.ray.RayExecutor: Horovod's RayExecutor over chorus. Each worker is an actor
in a placement group; rank 0's actor serves the rendezvous store (so a driver
connected through ray:// need not be reachable from the workers)."""
import re
import uuid
from dataclasses import dataclass
from typing import Optional, Set

import ray
from ray.util.placement_group import get_current_placement_group, placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from chorus import _core
from chorus.ray import worker as _worker
from chorus.runner.rank_process import rank_env


class WorkerError(RuntimeError):
    """A worker of a chorus Ray job failed or died; .rank and .node_id say which."""

    def __init__(self, rank, node_id, message):
        message = re.sub(r"\x1b\[[0-9;]*m", "", message)  # Ray colours its tracebacks
        super().__init__(f"chorus.ray: worker {rank} (rank {rank}, Ray node {node_id}) {message}")
        self.rank = rank
        self.node_id = node_id


@dataclass
class Settings:
    """RayExecutor.create_settings()'s result (Horovod's settings object)."""
    timeout_s: int = 30
    ssh_identity_file: Optional[str] = None
    ssh_str: Optional[str] = None
    placement_group_timeout_s: int = 100
    nics: Optional[Set[str]] = None


class _Worker:
    """The actor: chorus runs in its process for the executor's life (as Horovod's)."""

    def __init__(self):
        self.executable = None

    def node_info(self):
        return _worker.node_info()

    def hold_port(self):
        return _worker.hold_port()

    def setup(self, env, executable_cls, args, kwargs):
        _worker.set_env(env)
        if executable_cls is not None:
            self.executable = executable_cls(*(args or ()), **(kwargs or {}))

    def run(self, fn, args, kwargs):
        return fn(*(args or ()), **(kwargs or {}))

    def execute(self, fn):
        return fn(self.executable)

    def end_job(self):
        _worker.end_job()


class RayExecutor:
    """Runs a chorus job on Ray actors, with horovod.ray.RayExecutor's surface."""

    @classmethod
    def create_settings(cls, timeout_s=30, ssh_identity_file=None, ssh_str=None, placement_group_timeout_s=100,
                        nics=None):
        """ssh_*: accepted for Horovod's signature; chorus reaches its workers through Ray, not ssh."""
        return Settings(timeout_s, ssh_identity_file, ssh_str, placement_group_timeout_s, nics)

    def __init__(self, settings, num_workers=None, num_hosts=None, num_workers_per_host=1, cpus_per_worker=1,
                 use_gpu=False, gpus_per_worker=None, use_current_placement_group=True, num_slots=None,
                 cpus_per_slot=None, gpus_per_slot=None, **unused):
        if unused:
            raise TypeError(f"RayExecutor: unexpected arguments {sorted(unused)}")
        # Horovod's older names.
        num_workers = num_workers if num_workers is not None else num_slots
        cpus_per_worker = cpus_per_slot if cpus_per_slot is not None else cpus_per_worker
        gpus_per_worker = gpus_per_slot if gpus_per_slot is not None else gpus_per_worker
        if (num_workers is None) == (num_hosts is None):
            raise ValueError("RayExecutor: give num_workers, or num_hosts with num_workers_per_host (not both)")
        if num_hosts is not None and (num_hosts < 1 or num_workers_per_host < 1):
            raise ValueError(f"RayExecutor: num_hosts={num_hosts} and num_workers_per_host={num_workers_per_host} "
                             "must be positive")
        if num_workers is not None and num_workers < 1:
            raise ValueError(f"RayExecutor: num_workers={num_workers} must be positive")
        if gpus_per_worker and not use_gpu:
            raise ValueError("RayExecutor: gpus_per_worker needs use_gpu=True")
        self.settings = settings or Settings()
        self.num_hosts = num_hosts
        self.num_workers_per_host = num_workers_per_host
        self.num_workers = num_workers if num_workers is not None else num_hosts * num_workers_per_host
        self.cpus_per_worker = cpus_per_worker
        self.use_gpu = use_gpu
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.use_current_placement_group = use_current_placement_group
        self.workers = []
        self._nodes = []
        self._pg = None
        self._own_pg = False
        self._job_id = ""

    # -- start and stop --------------------------------------------------------------

    def _placement_group(self):
        current = get_current_placement_group() if self.use_current_placement_group else None
        if current is not None:
            return current, False
        one = {"CPU": self.cpus_per_worker}
        if self.gpus_per_worker:
            one["GPU"] = self.gpus_per_worker
        if self.num_hosts is not None:
            bundles = [{k: v * self.num_workers_per_host for k, v in one.items()}] * self.num_hosts
            strategy = "STRICT_SPREAD"
        else:
            bundles = [one] * self.num_workers
            strategy = "PACK"
        pg = placement_group(bundles, strategy=strategy)
        ready, _ = ray.wait([pg.ready()], timeout=self.settings.placement_group_timeout_s)
        if not ready:
            remove_placement_group(pg)
            raise TimeoutError(
                f"chorus.ray: the cluster did not offer {len(bundles)} bundles of {bundles[0]} ({strategy}) within "
                f"placement_group_timeout_s={self.settings.placement_group_timeout_s}; available: "
                f"{ray.available_resources()}")
        return pg, True

    def start(self, executable_cls=None, executable_args=None, executable_kwargs=None, extra_env_vars=None):
        """Starts the workers (actors), agrees the rendezvous, and makes executable_cls
        in each (execute() hands it to functions)."""
        if self.workers:
            raise RuntimeError("RayExecutor.start(): already started; call shutdown() first")
        self._pg, self._own_pg = self._placement_group()
        actor = ray.remote(_Worker)
        per_bundle = self.num_workers_per_host if self.num_hosts is not None else 1
        self.workers = [
            actor.options(num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker,
                          scheduling_strategy=PlacementGroupSchedulingStrategy(
                              placement_group=self._pg, placement_group_bundle_index=i // per_bundle
                              if self._own_pg else -1)).remote()
            for i in range(self.num_workers)]
        try:
            infos = self._get([w.node_info.remote() for w in self.workers], "starting")
            # Ranks of one node next to each other: chorus's local ranks, and shared memory within it.
            order = sorted(range(len(infos)), key=lambda i: ([n for n, _, _ in infos].index(infos[i][0]), i))
            self.workers = [self.workers[i] for i in order]
            infos = [infos[i] for i in order]
            self._nodes = [n for n, _, _ in infos]
            port = self._get([self.workers[0].hold_port.remote()], "holding rank 0's port")[0]
            secret = _core.generate_secret()
            job_id = self._job_id = "ray-" + uuid.uuid4().hex[:12]
            extra = {"CHORUS_START_TIMEOUT": str(int(self.settings.timeout_s))}
            if self.settings.nics:
                extra["CHORUS_IFACE"] = sorted(self.settings.nics)[0]
            extra.update({k: str(v) for k, v in (extra_env_vars or {}).items()})
            self._get([w.setup.remote(rank_env(r, self.num_workers, self._nodes, (infos[0][1], port), secret, job_id,
                                               extra), executable_cls, executable_args, executable_kwargs)
                       for r, w in enumerate(self.workers)], "setting up")
        except BaseException:
            self.shutdown()
            raise

    def shutdown(self):
        """Ends chorus in every worker, then the actors and the placement group. A
        worker still busy is killed; its node's shared memory is removed for it."""
        if self.workers:
            refs = [w.end_job.remote() for w in self.workers]
            ray.wait(refs, num_returns=len(refs), timeout=5)
            for w in self.workers:
                ray.kill(w)
            cleanup = ray.remote(num_cpus=0)(_worker.remove_segments)
            ray.wait([cleanup.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=True))
                      .remote(self._job_id) for node in set(self._nodes)], num_returns=len(set(self._nodes)),
                     timeout=30)
        self.workers = []
        self._nodes = []
        if self._pg is not None and self._own_pg:
            remove_placement_group(self._pg)
        self._pg = None

    # -- running ---------------------------------------------------------------------

    def _get(self, refs, what):
        """Every result in rank order; the first failure raises WorkerError naming its worker."""
        pending = {ref: i for i, ref in enumerate(refs)}
        results = [None] * len(refs)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                rank = pending.pop(ref)
                try:
                    results[rank] = ray.get(ref)
                except ray.exceptions.RayActorError as e:
                    raise WorkerError(rank, self._node(rank), f"died while {what}: {e}") from e
                except ray.exceptions.RayTaskError as e:
                    raise WorkerError(rank, self._node(rank), f"failed while {what}: {e}") from e
        return results

    def _node(self, rank):
        return self._nodes[rank] if rank < len(self._nodes) else "?"

    def _require_started(self):
        if not self.workers:
            raise RuntimeError("RayExecutor: call start() first")

    def run(self, fn, args=None, kwargs=None, callbacks=None):
        """fn(*args, **kwargs) on every worker; the results in rank order."""
        return self._get(self.run_remote(fn, args, kwargs), "running " + getattr(fn, "__name__", "the function"))

    def run_remote(self, fn, args=None, kwargs=None):
        """As run(), without waiting: one ObjectRef per worker."""
        self._require_started()
        return [w.run.remote(fn, args, kwargs) for w in self.workers]

    def execute(self, fn, callbacks=None):
        """fn(executable) on every worker (the executable_cls instance start() made)."""
        self._require_started()
        return self._get([w.execute.remote(fn) for w in self.workers], "executing")

    def execute_single(self, fn):
        """fn(executable) on rank 0 only."""
        self._require_started()
        return self._get([self.workers[0].execute.remote(fn)], "executing")[0]
