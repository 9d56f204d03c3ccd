"""Curriculum learning's sampler (data_efficiency.data_sampling.curriculum_learning), as
DeepSpeed 0.19.8's DeepSpeedDataSampler draws: each metric's difficulty follows its
schedule per global batch; when a difficulty changes, the samples newly admitted (by the
metric's value, or by its percentile, from the data analyzer's index files) form a new
cluster, shuffled; each global batch draws from the clusters in proportion to their
sizes, a cluster reshuffled when it runs out. The first rank of the data-parallel set
draws (the same random stream as DeepSpeed's, from data_efficiency.seed) and
broadcasts the batch; each rank yields its share of each micro-batch. The cluster files
go to data_cluster_path, as DeepSpeed's; the state (checkpoints) carries the random
stream itself, where DeepSpeed's saves numpy's global one."""
import os

import numpy as np
import torch

from chorus.deepspeed.runtime.data_pipeline.curriculum_scheduler import CurriculumScheduler
from chorus.deepspeed.runtime.data_pipeline.data_sampling.indexed_dataset import (MMapIndexedDataset,
                                                                                   find_fit_int_dtype, write_rows)


class DeepSpeedDataSampler:
    def __init__(self, data_efficiency_config, one_epoch_total_samples, micro_batch_size, data_parallel_rank,
                 data_parallel_size, data_parallel_group, gradient_accumulation_steps, global_rank, drop_last=True):
        import chorus.torch as hvd
        sampling = data_efficiency_config.get("data_sampling") or {}
        self.config = sampling.get("curriculum_learning") or {}
        self.one_epoch_total_samples = one_epoch_total_samples
        self.index_dtype = find_fit_int_dtype(0, one_epoch_total_samples)
        self.total_samples = one_epoch_total_samples * sampling.get("num_epochs", 1000)
        self.micro_batch_size = micro_batch_size
        self.data_parallel_rank, self.data_parallel_size = data_parallel_rank, data_parallel_size
        self.process_set = data_parallel_group if data_parallel_group is not None else hvd.global_process_set
        self.micro_batch_times_data_parallel_size = micro_batch_size * data_parallel_size
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.global_batch_size = self.micro_batch_times_data_parallel_size * gradient_accumulation_steps
        self.global_rank = global_rank
        self.drop_last = drop_last
        self.np_rng = np.random.default_rng(data_efficiency_config.get("seed", 1234))
        self.batch, self.consumed_samples = [], 0
        self.curriculum_step = 0
        self.current_difficulties = {}
        self.data_cluster_paths, self.data_cluster_current_position = [], []
        self.data_clusters, self.data_cluster_sizes = [], []
        self.curriculum_schedulers, self.difficulty_type, self.clustering_type = {}, {}, {}
        self.index_to_sample, self.index_to_metric = {}, {}
        self.data_1epoch_size = None
        self.cluster_root = self.config.get("data_cluster_path")
        metrics = self.config.get("curriculum_metrics")
        if not self.cluster_root or not metrics:
            raise ValueError("DeepSpeed config: curriculum learning needs 'data_cluster_path' and "
                             "'curriculum_metrics' under data_efficiency.data_sampling.curriculum_learning")
        self._first = self.process_set.rank() == 0
        if self._first:
            os.makedirs(self.cluster_root, exist_ok=True)
        for metric, cfg in metrics.items():
            self.curriculum_schedulers[metric] = CurriculumScheduler(cfg)
            self.difficulty_type[metric] = cfg.get("difficulty_type")
            self.clustering_type[metric] = cfg.get("clustering_type")
            if self.difficulty_type[metric] not in ("value", "percentile"):
                raise ValueError(f"DeepSpeed config: curriculum metric {metric!r}: 'difficulty_type' "
                                 f"{self.difficulty_type[metric]!r} is not value or percentile")
        error = None
        try:  # the index files, on the first rank (which draws): a failure there is raised on every rank
            for metric, cfg in metrics.items():
                if self._first and self.clustering_type[metric] != "single_cluster":
                    self.index_to_sample[metric] = self._open(cfg, "index_to_sample_path", metric)
                    if self.difficulty_type[metric] == "value":
                        self.index_to_metric[metric] = self._open(cfg, "index_to_metric_path", metric)
        except Exception as e:  # noqa: BLE001
            error = e
        self._agree(error, "open its index files", "open")
        if self.total_samples <= 0 or micro_batch_size <= 0 or not 0 <= data_parallel_rank < data_parallel_size:
            raise ValueError(f"curriculum sampler: {self.total_samples} samples, micro-batch {micro_batch_size}, "
                             f"rank {data_parallel_rank} of {data_parallel_size}")

    def _agree(self, error, what, tag):
        """Raises error here, and on the other ranks that the first rank could not do what."""
        import chorus.torch as hvd
        failed = torch.tensor([0 if error is None else 1])
        if self.process_set.size() > 1:
            failed = hvd.broadcast(failed, self.process_set.ranks[0], name=f"chorus.curriculum.{tag}",
                                   process_set=self.process_set)
        if error is not None:
            raise error
        if int(failed.item()):
            raise RuntimeError(f"curriculum: the data-parallel set's first rank could not {what}")

    @staticmethod
    def _open(cfg, key, metric):
        path = cfg.get(key)
        if not path or not MMapIndexedDataset.exists(path):
            raise ValueError(f"DeepSpeed config: curriculum metric {metric!r}: '{key}' {path!r} names no index "
                             "file (PATH.idx and PATH.bin, as the data analyzer writes them)")
        return MMapIndexedDataset(path)

    def __len__(self):
        return self.total_samples

    def set_custom_curriculum_learning_schedule(self, schedule_func_dict):
        for metric, fn in schedule_func_dict.items():
            if metric in self.curriculum_schedulers:
                self.curriculum_schedulers[metric].set_custom_get_difficulty(fn)

    def get_start_end_idx(self, batch_len=None):
        batch_len = batch_len or self.micro_batch_times_data_parallel_size
        edge = lambda r: round(r * batch_len / self.process_set.size())  # noqa: E731
        return edge(self.data_parallel_rank), edge(self.data_parallel_rank + 1)

    def get_sample_based_on_metric_value(self, metric, value_start, value_end):
        rows = [np.copy(self.index_to_sample[metric][i]) for i in range(len(self.index_to_sample[metric]))
                if value_start < self.index_to_metric[metric][i][0] <= value_end]
        return np.concatenate(rows, axis=None) if rows else None

    def get_sample_based_on_metric_percentile(self, metric, percentile_start, percentile_end):
        index = self.index_to_sample[metric]
        if self.data_1epoch_size is None:
            self.data_1epoch_size = sum(len(index[i]) for i in range(len(index)))
        top = self.config["curriculum_metrics"][metric]["max_difficulty"]
        per = self.data_1epoch_size // top
        start, end = per * percentile_start, per * percentile_end
        if percentile_end == top:
            end = self.data_1epoch_size
        rows, count = [], 0
        for i in range(len(index)):
            size = len(index[i])
            if count + size > start:
                rows.append(np.copy(index[i][max(0, start - count):size if count + size <= end else end - count]))
            count += size
            if count >= end:
                break
        return np.concatenate(rows, axis=None) if rows else None

    def _admitted(self, metric, low, high):
        if self.difficulty_type[metric] == "value":
            return self.get_sample_based_on_metric_value(metric, low, high)
        return self.get_sample_based_on_metric_percentile(metric, low, high)

    def get_new_cluster(self, previous_difficulties):
        name = "cluster" + "".join(f"_{m}{self.current_difficulties[m]}" for m in self.curriculum_schedulers)
        if self._first:
            clustered = [m for m in self.clustering_type if self.clustering_type[m] != "single_cluster"]
            new = None
            if len(clustered) > 1:  # every metric's admitted samples, intersected, less the clusters so far
                for m in self.curriculum_schedulers:
                    part = np.arange(self.one_epoch_total_samples, dtype=self.index_dtype) \
                        if self.clustering_type[m] == "single_cluster" else \
                        self._admitted(m, float("-inf") if self.difficulty_type[m] == "value" else 0,
                                       self.current_difficulties[m])
                    new = part if new is None else np.intersect1d(new, part, assume_unique=True)
                for cluster in self.data_clusters:
                    new = np.setdiff1d(new, cluster, assume_unique=True)
            else:
                if not self.data_clusters:
                    new = np.arange(self.one_epoch_total_samples, dtype=self.index_dtype)
                for m in clustered:
                    new = self._admitted(m, previous_difficulties[m], self.current_difficulties[m])
            if new is not None and len(new) > 0:
                new = new.astype(self.index_dtype)
                self.np_rng.shuffle(new)
                self._write(name, new)
                self.data_clusters.append(new)
                self.data_cluster_sizes.append(len(new))
                self.data_cluster_paths.append(name)
                self.data_cluster_current_position.append(0)

    def _write(self, name, cluster):
        """The cluster's file (for checkpoints): written by the job's first rank only, as every
        data-parallel set (one per sequence-parallel rank) draws the same clusters."""
        import chorus.torch as hvd
        if not hvd.is_initialized() or hvd.rank() == 0:
            write_rows(os.path.join(self.cluster_root, name), [cluster], self.index_dtype)

    def sample_from_clusters(self):
        total = sum(self.data_cluster_sizes)
        picks = self.np_rng.choice(len(self.data_clusters), self.global_batch_size, replace=True,
                                   p=[s / total for s in self.data_cluster_sizes])
        return np.bincount(picks, minlength=len(self.data_clusters))

    def reshuffle_clusters(self, cidx):
        cluster = np.copy(self.data_clusters[cidx])
        self.np_rng.shuffle(cluster)
        self._write(self.data_cluster_paths[cidx], cluster)
        self.data_clusters[cidx] = cluster

    def get_sample_from_cluster(self, cidx, num_samples):
        start = self.data_cluster_current_position[cidx]
        samples = list(np.copy(self.data_clusters[cidx][start:start + num_samples]))
        self.data_cluster_current_position[cidx] += num_samples
        if len(samples) < num_samples:
            left = num_samples - len(samples)
            self.reshuffle_clusters(cidx)
            samples += list(np.copy(self.data_clusters[cidx][:left]))
            self.data_cluster_current_position[cidx] = left
        return samples

    def get_next_global_batch(self):
        import chorus.torch as hvd
        self.curriculum_step += 1
        changed, previous = False, {}
        for metric, scheduler in self.curriculum_schedulers.items():
            difficulty = scheduler.update_difficulty(self.curriculum_step)
            changed |= self.current_difficulties.get(metric) != difficulty
            previous[metric] = self.current_difficulties.get(
                metric, float("-inf") if self.difficulty_type[metric] == "value" else 0)
            self.current_difficulties[metric] = difficulty
        # The first rank draws; whatever fails there is raised on every rank (after the broadcast).
        batch = torch.full((self.global_batch_size + 1,), -1, dtype=torch.long)
        error = None
        try:
            if changed:
                self.get_new_cluster(previous)
            if self._first:
                if not self.data_clusters:
                    raise ValueError(f"curriculum: no sample meets the difficulties {self.current_difficulties}")
                drawn = []
                for cidx, n in enumerate(self.sample_from_clusters()):
                    drawn += self.get_sample_from_cluster(cidx, n)
                self.np_rng.shuffle(drawn)
                batch[1:len(drawn) + 1] = torch.tensor([int(s) for s in drawn], dtype=torch.long)
        except Exception as e:  # noqa: BLE001
            error, batch[0] = e, 1
        if self.process_set.size() > 1:
            batch = hvd.broadcast(batch, self.process_set.ranks[0], name=f"chorus.curriculum.{self.curriculum_step}",
                                  process_set=self.process_set)
        if error is not None:
            raise error
        if int(batch[0]) == 1:
            raise RuntimeError("curriculum: the data-parallel set's first rank failed to draw the global batch")
        batch = batch[1:]
        self.batch = batch[batch != -1].tolist()

    def __iter__(self):
        step = self.micro_batch_times_data_parallel_size
        while self.consumed_samples <= self.total_samples:
            if not self.batch:
                self.get_next_global_batch()
            current, self.batch = self.batch[:step], self.batch[step:]
            if len(current) == step or (current and not self.drop_last):
                start, end = self.get_start_end_idx(len(current))
                yield current[start:end]
                self.consumed_samples += len(current)

    def state_dict(self):
        return {"batch": list(self.batch), "consumed_samples": self.consumed_samples,
                "curriculum_step": self.curriculum_step,
                "current_difficulties": {k: v for k, v in self.current_difficulties.items()},
                "data_cluster_paths": list(self.data_cluster_paths),
                "data_cluster_current_position": [int(p) for p in self.data_cluster_current_position],
                "np_rng_state": self.np_rng.bit_generator.state}

    def load_state_dict(self, state):
        self.batch = list(state["batch"])
        self.consumed_samples = state["consumed_samples"]
        self.curriculum_step = state["curriculum_step"]
        self.current_difficulties = dict(state["current_difficulties"])
        self.data_cluster_paths = [p.split("/")[-1] for p in state["data_cluster_paths"]]
        self.data_cluster_current_position = list(state["data_cluster_current_position"])
        if isinstance(state.get("np_rng_state"), dict):
            self.np_rng.bit_generator.state = state["np_rng_state"]
        for metric, scheduler in self.curriculum_schedulers.items():
            if metric in self.current_difficulties:
                scheduler.set_current_difficulty(self.current_difficulties[metric])
        self.data_clusters, self.data_cluster_sizes = [], []
        error = None
        try:
            if self._first:
                for name in self.data_cluster_paths:
                    cluster = np.copy(MMapIndexedDataset(os.path.join(self.cluster_root, name))[0])
                    self.data_clusters.append(cluster)
                    self.data_cluster_sizes.append(len(cluster))
        except Exception as e:  # noqa: BLE001
            error = e
        self._agree(error, "read the checkpoint's cluster files", f"load.{self.curriculum_step}")
