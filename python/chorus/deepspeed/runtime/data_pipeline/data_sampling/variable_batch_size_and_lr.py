"""DeepSpeed's dynamic batching (data_efficiency.data_sampling.dynamic_batching): batches
packed by sequence length up to max_tokens, a loader over them, and an LR scheduler that
scales each step's learning rate with its batch size, as DeepSpeed 0.19.8 builds them
(the same micro-batches, the same interleaving over ranks, the same learning rates).
As in DeepSpeed, the engine does not use them on its own: the script calls
get_dataloader_and_lr_scheduler_for_variable_batch_size_deepspeed(dataset, engine, ...)."""
import math
import os
import random
import warnings

import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler

try:  # (torch 2 renamed it)
    from torch.optim.lr_scheduler import LRScheduler
except ImportError:  # pragma: no cover - torch 1.13
    from torch.optim.lr_scheduler import _LRScheduler as LRScheduler

_ORDERS = ("random", "seqlen", "dataloader")


def batch_by_seqlens(seqlens, max_tokens, sequence_ids_per_mb=None, min_batch_size=1, max_batch_size=None,
                     sequence_picking_order="dataloader", effective_batch_size=1,
                     required_microbatches_of_same_size=False, verbose=False, seed=None):
    """(microbatch_ids, batch_sizes, batch_max_seqlens): micro-batches whose summed lengths
    stay within max_tokens, effective_batch_size of them per batch (one per rank and
    accumulation step); each microbatch_ids entry is (batch id, its sample ids)."""
    if sequence_picking_order not in _ORDERS:
        raise ValueError(f"dynamic batching: sequence_picking_order must be one of {_ORDERS}, "
                         f"got {sequence_picking_order!r}")
    ids = range(len(seqlens)) if sequence_ids_per_mb is None else list(sequence_ids_per_mb)
    values = np.asarray(seqlens)
    metrics = [(values[i].item(), i) for i in ids]
    if sequence_picking_order == "random":
        random.Random(seed).shuffle(metrics)
    elif sequence_picking_order == "seqlen":
        metrics.sort()
    too_long = {i for v, i in metrics if v > max_tokens}
    if too_long:
        warnings.warn(f"dynamic batching: samples {sorted(too_long)} are left out: each alone exceeds "
                      f"max_tokens {max_tokens}")
        metrics = [m for m in metrics if m[1] not in too_long]

    def fits(mb):
        if min_batch_size and len(mb) < min_batch_size:
            return False
        return (not max_batch_size or len(mb) <= max_batch_size) and sum(v for v, _ in mb) <= max_tokens

    def over(mb):  # (lengths are not negative: once over, every longer one is over too)
        return (max_batch_size and len(mb) > max_batch_size) or sum(v for v, _ in mb) > max_tokens

    # Each batch takes as many samples as keep every one of its `step` interleaved micro-batches
    # within the limits (DeepSpeed's search stops one short of the last sample, and so does this).
    step = effective_batch_size if required_microbatches_of_same_size else 1
    microbatches, start = [], 0
    while start < len(metrics):
        best = start
        for end in range(start + step, len(metrics), step):
            mbs = [metrics[start:end][b::step] for b in range(step)]
            if all(fits(mb) for mb in mbs):
                best = end
            elif any(over(mb) for mb in mbs):
                break
        if best == start:
            break
        mbs = [metrics[start:best][b::step] for b in range(step)]
        start += sum(len(mb) for mb in mbs)
        microbatches += mbs
    if len(microbatches) < effective_batch_size:
        raise ValueError(f"dynamic batching: {len(microbatches)} micro-batches from the dataset, fewer than the "
                         f"{effective_batch_size} one batch needs (max_tokens {max_tokens})")
    microbatches = microbatches[:len(microbatches) - len(microbatches) % effective_batch_size]

    microbatch_ids, batch_sizes, batch_max_seqlens = [], [], []
    for batch_id, first in enumerate(range(0, len(microbatches), effective_batch_size)):
        mbs = microbatches[first:first + effective_batch_size]
        batch_sizes.append(sum(len(mb) for mb in mbs))
        batch_max_seqlens.append(max(v for mb in mbs for v, _ in mb))
        microbatch_ids += [(batch_id, [i for _, i in mb]) for mb in mbs]
        if verbose:
            print(f"dynamic batching: batch {batch_id}: {len(mbs)} micro-batches, {batch_sizes[-1]} sequences, "
                  f"tokens per micro-batch {[sum(v for v, _ in mb) for mb in mbs]}")
    return microbatch_ids, batch_sizes, batch_max_seqlens


def scale_lr(base_batch_size, batch_size, base_lr=1, method="linear"):
    """The learning rate for batch_size, from base_lr at base_batch_size: linear (Goyal et al.),
    sqrt (Krizhevsky) or none."""
    if method == "linear":
        return base_lr * batch_size / base_batch_size
    if method == "sqrt":
        return base_lr * math.sqrt(batch_size / base_batch_size)
    if method is None or str(method).upper() == "NONE":
        return base_lr
    raise ValueError(f"dynamic batching: unknown lr_scaling_method {method!r} (linear, sqrt or none)")


def dataloader_for_variable_batch_size(dataset, microbatch_ids, batch_max_seqlens, dataloader_rank=0,
                                       dataloader_batch_size=1, dataloader_num_replicas=1, dataloader_collate_fn=None,
                                       dataloader_num_workers=2, dataloader_pin_memory=False,
                                       required_microbatches_of_same_seqlen=False, sample_padding_fn=None):
    """(loader, deepspeed_io kwargs): the micro-batches dealt to the ranks in turn; each of
    the loader's items holds the samples of dataloader_batch_size micro-batches, collated."""
    if required_microbatches_of_same_seqlen and sample_padding_fn is None:
        raise ValueError("dynamic batching: micro-batches of one sequence length need sample_padding_fn")
    sampler = DistributedSampler(microbatch_ids, num_replicas=dataloader_num_replicas, rank=dataloader_rank,
                                 shuffle=False, drop_last=False)

    def collate(items):
        samples = []
        for batch_id, ids in items:
            got = [dataset[i] for i in ids]
            if required_microbatches_of_same_seqlen:
                longest = batch_max_seqlens[batch_id]
                if any(len(s) > longest for s in got):
                    raise ValueError(f"dynamic batching: a sample of batch {batch_id} is longer than its "
                                     f"longest length {longest}")
                got = [sample_padding_fn(s, longest) for s in got]
            samples += got
        return dataloader_collate_fn(samples) if dataloader_collate_fn else samples

    loader = DataLoader(microbatch_ids, batch_size=dataloader_batch_size, sampler=sampler,
                        num_workers=dataloader_num_workers, collate_fn=collate, pin_memory=dataloader_pin_memory)
    return loader, dict(dataset=microbatch_ids, batch_size=dataloader_batch_size, pin_memory=dataloader_pin_memory,
                        data_sampler=sampler, collate_fn=collate, num_local_io_workers=dataloader_num_workers)


class VariableBatchSizeLR(LRScheduler):
    """Scales another scheduler's learning rate by each step's batch size: step() steps the
    base scheduler on the unscaled rates, then scales them for the next batch."""

    def __init__(self, lr_scheduler, base_batch_size, batch_sizes, dataloader, lr_scaling_method="linear",
                 last_epoch=-1, verbose=False):
        self.batch_sizes = batch_sizes
        self.base_batch_size = base_batch_size
        self.lr_scaling_method = lr_scaling_method
        self.dataloader = dataloader
        self.base_lr_scheduler = lr_scheduler
        self.base_lrs = self.base_lr_scheduler.get_lr()
        self.last_epoch = last_epoch
        self.verbose = verbose
        self.step(0)  # the first batch's rate

    @property
    def optimizer(self):
        return self.base_lr_scheduler.optimizer

    def state_dict(self):
        return {"base_lr_scheduler": self.base_lr_scheduler.state_dict(), "base_batch_size": self.base_batch_size,
                "lr_scaling_method": self.lr_scaling_method, "batch_sizes": self.batch_sizes,
                "base_lrs": self.base_lrs, "last_epoch": self.last_epoch, "verbose": self.verbose}

    def load_state_dict(self, state_dict):
        self.base_lr_scheduler.load_state_dict(state_dict["base_lr_scheduler"])
        for key in ("base_batch_size", "lr_scaling_method", "batch_sizes", "base_lrs", "last_epoch", "verbose"):
            setattr(self, key, state_dict[key])

    def get_last_lr(self):
        return self.base_lr_scheduler._last_lr

    def get_lr(self):
        return [g["lr"] for g in self.base_lr_scheduler.optimizer.param_groups]

    def step(self, epoch=None):
        unscaled = self.base_lrs if epoch == 0 else self.get_last_lr()
        for group, lr in zip(self.optimizer.param_groups, unscaled):
            group["lr"] = lr
        self.base_lr_scheduler.step(epoch)
        self.last_epoch = self.last_epoch + 1 if epoch is None else epoch
        size = self.batch_sizes[self.last_epoch % len(self.batch_sizes)]
        for group in self.optimizer.param_groups:
            group["lr"] = scale_lr(self.base_batch_size, size, group["lr"], self.lr_scaling_method)
        if self.verbose:
            print(f"dynamic batching: batch {self.last_epoch} of {size} sequences: lr {self.get_lr()}")


class _ConstantLR(LRScheduler):
    """The optimizer's own rates, unchanged (the base when there is no scheduler)."""

    def get_lr(self):
        return self.base_lrs


def lr_scheduler_for_variable_batch_size(base_batch_size, batch_sizes, dataloader, lr_scheduler_or_optimizer,
                                         lr_scaling_method="linear", verbose=False):
    # (chorus's engine optimizer lends torch's schedulers an Optimizer over its own param_groups)
    plain = getattr(lr_scheduler_or_optimizer, "basic_optimizer", lr_scheduler_or_optimizer)
    if isinstance(plain, torch.optim.Optimizer):
        base = _ConstantLR(plain)
    elif hasattr(getattr(lr_scheduler_or_optimizer, "optimizer", None), "param_groups"):
        base = lr_scheduler_or_optimizer
    else:
        raise ValueError(f"dynamic batching: expected an LR scheduler or an optimizer, got "
                         f"{type(lr_scheduler_or_optimizer).__name__}")
    return VariableBatchSizeLR(base, base_batch_size, batch_sizes, dataloader, lr_scaling_method, verbose=verbose)


def get_dataloader_and_lr_scheduler_for_variable_batch_size(
        dataset, dataset_seqlens, max_tokens, effective_batch_size, dataset_filter_ids=None,
        lr_scaling_method="linear", min_batch_size=1, max_batch_size=None, sequence_picking_order="dataloader",
        dataloader_batch_size=1, dataloader_rank=0, dataloader_num_replicas=1, dataloader_num_workers=0,
        dataloader_collate_fn=None, dataloader_pin_memory=False, lr_scheduler_or_optimizer=None,
        required_microbatches_of_same_size=False, required_microbatches_of_same_seqlen=False,
        sample_padding_fn=None, verbose=False, seed=None):
    """(loader, LR scheduler, deepspeed_io kwargs) for batches packed by length."""
    ids, sizes, longest = batch_by_seqlens(dataset_seqlens, max_tokens, dataset_filter_ids, min_batch_size,
                                           max_batch_size, sequence_picking_order, effective_batch_size,
                                           required_microbatches_of_same_size, verbose, seed)
    loader, io_kwargs = dataloader_for_variable_batch_size(
        dataset, ids, longest, dataloader_rank, dataloader_batch_size, dataloader_num_replicas, dataloader_collate_fn,
        dataloader_num_workers, dataloader_pin_memory, required_microbatches_of_same_seqlen, sample_padding_fn)
    scheduler = lr_scheduler_for_variable_batch_size(effective_batch_size, sizes, loader, lr_scheduler_or_optimizer,
                                                     lr_scaling_method, verbose)
    return loader, scheduler, io_kwargs


def _seqlens_from_metrics(dataset, engine, path, batch_seqlens_fn, collate_fn):
    """Each sample's length: from the analyzer's seqlen files under path, else measured by
    batch_seqlens_fn over the dataset (a share per rank) and written there first."""
    from chorus.deepspeed.runtime.data_pipeline.data_sampling.indexed_dataset import MMapIndexedDataset, write_rows
    prefix = os.path.join(path, "seqlen", "seqlen_sample_to_metric")
    if not (os.path.exists(prefix + ".bin") and os.path.exists(prefix + ".idx")):
        if batch_seqlens_fn is None:
            raise ValueError(f"dynamic batching: no sequence lengths: {prefix}.bin/.idx are missing and neither "
                             "dataset_seqlens nor batch_seqlens_fn was given")
        import chorus.torch as hvd
        pset = engine._data_set()
        share = np.array_split(np.arange(len(dataset)), pset.size())[pset.rank()]
        mine, where = [], []
        loader = DataLoader(torch.utils.data.Subset(dataset, share.tolist()), batch_size=1024,
                            collate_fn=collate_fn)
        position = int(share[0]) if len(share) else 0
        for batch in loader:
            values = torch.as_tensor(batch_seqlens_fn(batch)).reshape(-1)
            mine += [int(v) for v in values.tolist()]
            if isinstance(batch, dict) and "index" in batch:  # (Megatron's batches name their samples)
                where += [int(batch["index"][row][0]) for row in range(len(values))]
            else:
                where += list(range(position, position + len(values)))
            position += len(values)
        pairs = torch.tensor([mine, where], dtype=torch.int64).t().contiguous()
        every = hvd.allgather(pairs, name="chorus.dynamic_batching.seqlens", process_set=pset)
        if pset.rank() == 0:
            lengths = np.zeros(len(dataset), dtype=np.int64)
            lengths[every[:, 1].numpy()] = every[:, 0].numpy()
            os.makedirs(os.path.dirname(prefix), exist_ok=True)
            write_rows(prefix, [[int(v)] for v in lengths], np.int64)
        hvd.barrier(process_set=pset)
    lengths = MMapIndexedDataset(prefix, skip_warmup=True)
    if len(lengths) != len(dataset):
        raise ValueError(f"dynamic batching: {prefix} holds {len(lengths)} lengths for a dataset of {len(dataset)} "
                         "samples; delete the metrics folder if the dataset changed")
    return np.array([np.asarray(lengths[i]).reshape(-1)[0] for i in range(len(lengths))], dtype=np.int64)


def get_dataloader_and_lr_scheduler_for_variable_batch_size_deepspeed(dataset, engine, dataset_seqlens=None,
                                                                      dataset_filter_ids=None,
                                                                      dataloader_collate_fn=None,
                                                                      sample_padding_fn=None, batch_seqlens_fn=None):
    """The same from the engine's config (data_efficiency.data_sampling.dynamic_batching)."""
    efficiency = engine._raw_config.get("data_efficiency") or {}
    sampling = efficiency.get("data_sampling") or {}
    cfg = sampling.get("dynamic_batching") or {}
    if not cfg.get("enabled", False):
        raise ValueError("dynamic batching: data_efficiency.data_sampling.dynamic_batching.enabled is not true")
    if "max_tokens" not in cfg:
        raise ValueError("DeepSpeed config: 'data_efficiency.data_sampling.dynamic_batching.max_tokens' is needed "
                         "when dynamic batching is enabled")
    if dataset_seqlens is None:
        dataset_seqlens = _seqlens_from_metrics(dataset, engine, cfg.get("metrics_path", "./curriculum_output"),
                                                batch_seqlens_fn, dataloader_collate_fn)
    from chorus.deepspeed.runtime.pipe.engine import PipelineEngine
    pipe = isinstance(engine, PipelineEngine)
    pset = engine._data_set()
    return get_dataloader_and_lr_scheduler_for_variable_batch_size(
        dataset=dataset, dataset_filter_ids=dataset_filter_ids, dataset_seqlens=dataset_seqlens,
        effective_batch_size=engine.train_batch_size(), max_tokens=int(cfg["max_tokens"]),
        lr_scaling_method=str(cfg.get("lr_scaling_method", "linear")),
        sequence_picking_order=str(cfg.get("sequence_picking_order", "dataloader")),
        min_batch_size=int(cfg.get("min_batch_size", 1)),
        max_batch_size=int(cfg["max_batch_size"]) if cfg.get("max_batch_size") is not None else None,
        dataloader_batch_size=engine.train_micro_batch_size_per_gpu(), dataloader_rank=pset.rank(),
        dataloader_num_replicas=pset.size(), dataloader_num_workers=int(sampling.get("num_workers", 0)),
        dataloader_collate_fn=dataloader_collate_fn, dataloader_pin_memory=bool(sampling.get("pin_memory", False)),
        sample_padding_fn=sample_padding_fn, lr_scheduler_or_optimizer=engine.lr_scheduler or engine.optimizer,
        required_microbatches_of_same_size=pipe, required_microbatches_of_same_seqlen=pipe,
        verbose=bool(cfg.get("verbose", False)), seed=efficiency.get("seed", 1234))
