"""Ray Train backends for chorus: HorovodTrainer (the trainer Ray removed, with its
signature) and ChorusConfig, which starts chorus beside torch.distributed under
TorchTrainer: rank 0 holds a real free port and serves the store there, with a
secret made for the job (not MASTER_PORT+1 and a secret derived from the variables)."""
import uuid
from dataclasses import dataclass
from typing import Optional, Set

import ray
from ray.train.backend import Backend, BackendConfig
from ray.train.torch.config import TorchConfig, _TorchBackend

from chorus import _core
from chorus.ray import worker as _worker
from chorus.runner.rank_process import rank_env

try:  # Ray Train v2 (the default since Ray 2.51), else v1 (RAY_TRAIN_V2_ENABLED=0 or an older Ray)
    from ray.train.v2._internal.constants import is_v2_enabled
except ImportError:  # pragma: no cover - Ray before v2
    def is_v2_enabled():
        return False
if is_v2_enabled():
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
else:
    from ray.train.data_parallel_trainer import DataParallelTrainer


def _start_chorus(worker_group, key=None, timeout_s=300, nics=None):
    """Gives every worker of the group chorus's variables; rank i is Ray Train's world rank i."""
    infos = worker_group.execute(_worker.node_info)
    nodes = [node for node, _, _ in infos]
    port = worker_group.execute_single(0, _worker.hold_port)
    secret = key or _core.generate_secret()
    extra = {"CHORUS_START_TIMEOUT": str(int(timeout_s))}
    if nics:
        extra["CHORUS_IFACE"] = sorted(nics)[0]
    job_id = "raytrain-" + uuid.uuid4().hex[:12]
    ray.get([worker_group.execute_single_async(
        r, _worker.set_env, rank_env(r, len(nodes), nodes, (infos[0][1], port), secret, job_id, extra))
        for r in range(len(nodes))])


@dataclass
class HorovodConfig(BackendConfig):
    """Ray's HorovodConfig fields; ssh_* are accepted and unused (Ray reaches the workers)."""
    nics: Optional[Set[str]] = None
    verbose: int = 1
    key: Optional[str] = None
    ssh_port: Optional[int] = None
    ssh_identity_file: Optional[str] = None
    ssh_str: Optional[str] = None
    timeout_s: int = 300
    placement_group_timeout_s: int = 100

    @property
    def backend_cls(self):
        return _ChorusBackend


class _ChorusBackend(Backend):
    share_cuda_visible_devices = True

    def on_start(self, worker_group, backend_config):
        _start_chorus(worker_group, backend_config.key, backend_config.timeout_s, backend_config.nics)

    def on_shutdown(self, worker_group, backend_config):
        worker_group.execute(_worker.end_job)


@dataclass
class ChorusConfig(TorchConfig):
    """TorchConfig (torch.distributed as TorchTrainer sets it up) with chorus beside it."""
    key: Optional[str] = None
    timeout_s: int = 300
    nics: Optional[Set[str]] = None

    @property
    def backend_cls(self):
        return _ChorusTorchBackend


class _ChorusTorchBackend(_TorchBackend):
    def on_start(self, worker_group, backend_config):
        super().on_start(worker_group, backend_config)
        _start_chorus(worker_group, backend_config.key, backend_config.timeout_s, backend_config.nics)

    def on_shutdown(self, worker_group, backend_config):
        worker_group.execute(_worker.end_job)
        super().on_shutdown(worker_group, backend_config)


class HorovodTrainer(DataParallelTrainer):
    """ray.train.horovod.HorovodTrainer's signature, on chorus: train_loop_per_worker
    calls hvd.init() (chorus.torch or chorus.tensorflow) and ray.train.report()."""

    def __init__(self, train_loop_per_worker, *, train_loop_config=None, horovod_config=None, scaling_config=None,
                 dataset_config=None, run_config=None, datasets=None, metadata=None, resume_from_checkpoint=None):
        kwargs = dict(train_loop_config=train_loop_config, backend_config=horovod_config or HorovodConfig(),
                      scaling_config=scaling_config, run_config=run_config, datasets=datasets, metadata=metadata,
                      resume_from_checkpoint=resume_from_checkpoint)
        if dataset_config is not None:
            kwargs["dataset_config"] = dataset_config
        super().__init__(train_loop_per_worker, **kwargs)
