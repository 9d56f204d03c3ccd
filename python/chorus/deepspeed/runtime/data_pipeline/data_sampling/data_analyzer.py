"""The data analyzer curriculum learning reads its index files from, as DeepSpeed 0.19.8's
DataAnalyzer writes them (same names, same files, so either side's output serves the
other's sampler).

Map: each worker (worker_id of num_workers) and each of its threads runs the metric
functions over its contiguous share of the dataset, in batches, and writes, per metric
in SAVE/METRIC/worker{w}_thread{t}/: for "single_value_per_sample", the value of each
sample (METRIC_sample_to_metric) and, per value, the samples that have it (CSV rows,
METRIC_metric_to_sample_VALUE.csv); for "accumulate_value_over_samples", the running
sum (METRIC_metric_value). Reduce (worker 0): SAVE/METRIC/METRIC_sample_to_metric,
METRIC_index_to_sample (the samples of each value, values ascending) with
METRIC_index_to_metric (the values), METRIC_index_to_sample_percentile_merged (about
100 rows of those, merged), or METRIC_metric_value; integer dtypes fitted to the range."""
import csv
import glob
import os
from collections import defaultdict
from multiprocessing import Process

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, Subset

from chorus.deepspeed.runtime.data_pipeline.data_sampling.indexed_dataset import (
    MMapIndexedDataset, close_mmap_dataset_builder, create_mmap_dataset_builder, find_fit_int_dtype, _np_dtype)

TYPES = ("single_value_per_sample", "accumulate_value_over_samples")


def split_index(start, end, parts):
    edges = np.linspace(start, end, dtype=int, num=parts + 1)
    return [(int(edges[i]), int(edges[i + 1])) for i in range(parts)]


class DataAnalyzer:
    def __init__(self, dataset, num_workers=1, worker_id=0, num_threads=1, num_threads_reduce=1, specific_threads=(),
                 batch_size=1, metric_names=(), metric_functions=(), metric_types=(), metric_dtypes=(),
                 save_path="./", collate_fn=None, custom_map_init=None, custom_map_update=None,
                 custom_map_finalize=None, custom_reduce=None, sample_indices=None):
        if not len(metric_names) == len(metric_functions) == len(metric_types) == len(metric_dtypes):
            raise ValueError("DataAnalyzer: metric_names, metric_functions, metric_types and metric_dtypes must "
                             "have one entry per metric")
        bad = [t for t in metric_types if t not in TYPES]
        if bad:
            raise ValueError(f"DataAnalyzer: metric types {bad} are not one of {list(TYPES)}")
        self.dataset, self.num_workers, self.worker_id = dataset, num_workers, worker_id
        self.num_threads, self.num_threads_reduce = num_threads, num_threads_reduce
        self.specific_threads, self.batch_size = list(specific_threads), batch_size
        self.metric_names, self.metric_functions = list(metric_names), list(metric_functions)
        self.metric_types, self.metric_dtypes = list(metric_types), [_np_dtype(d) for d in metric_dtypes]
        self.save_path, self.collate_fn, self.sample_indices = save_path, collate_fn, sample_indices
        self.custom_map_init, self.custom_map_update = custom_map_init, custom_map_update
        self.custom_map_finalize, self.custom_reduce = custom_map_finalize, custom_reduce

    # --- map ------------------------------------------------------------------------------
    def _dir(self, metric, worker, thread):
        return f"{self.save_path}/{metric}/worker{worker}_thread{thread}/"

    def init_metric_results(self, thread_id, metric_names, metric_types, metric_dtypes, save_path, worker_id):
        results = []
        for name, kind, dtype in zip(metric_names, metric_types, metric_dtypes):
            where = self._dir(name, worker_id, thread_id)
            os.makedirs(where, exist_ok=True)
            if kind == "single_value_per_sample":
                to_sample = f"{where}/{name}_metric_to_sample"
                for stale in glob.glob(f"{glob.escape(to_sample)}*"):
                    os.remove(stale)
                results.append({"sample_to_metric_fname": f"{where}/{name}_sample_to_metric",
                                "sample_to_metric_builder": create_mmap_dataset_builder(
                                    f"{where}/{name}_sample_to_metric", dtype),
                                "metric_to_sample_fname": to_sample, "metric_to_sample_dict": defaultdict(list)})
            else:
                results.append({"metric_value": None, "metric_value_fname": f"{where}/{name}_metric_value"})
        return results

    @staticmethod
    def _flush(result, value):
        with open(f"{result['metric_to_sample_fname']}_{value}.csv", "a") as f:
            csv.writer(f).writerows([result["metric_to_sample_dict"][value]])
        result["metric_to_sample_dict"][value] = []

    def update_metric_results(self, data, metric_types, metric_dtypes, metric_functions, metric_results,
                              batch_start_idx=0):
        for kind, dtype, fn, result in zip(metric_types, metric_dtypes, metric_functions, metric_results):
            values = fn(data)
            if not (torch.is_tensor(values) or isinstance(values, np.ndarray)):
                raise ValueError("DataAnalyzer: a metric function must return a tensor or a numpy array")
            if isinstance(values, np.ndarray):
                values = torch.from_numpy(values)
            if _np_dtype(values.dtype) is not dtype:
                raise ValueError(f"DataAnalyzer: a metric function returned {values.dtype}, its metric_dtype is "
                                 f"{dtype.__name__}")
            if kind == "single_value_per_sample":
                for row in range(values.size(0)):
                    sample = batch_start_idx + row
                    if isinstance(data, dict) and "index" in data:  # (Megatron's datasets carry the index)
                        sample = data["index"][row][0].item()
                    elif self.sample_indices is not None:
                        sample = self.sample_indices[sample]
                    result["sample_to_metric_builder"].add_item(values[row].reshape(-1))
                    result["metric_to_sample_dict"][values[row].item()].append(sample)
                for value in list(result["metric_to_sample_dict"]):
                    if len(result["metric_to_sample_dict"][value]) > 100:
                        self._flush(result, value)
            else:
                result["metric_value"] = values.clone() if result["metric_value"] is None \
                    else result["metric_value"].add_(values)

    def finalize_metric_results(self, metric_types, metric_dtypes, metric_results):
        for kind, dtype, result in zip(metric_types, metric_dtypes, metric_results):
            if kind == "single_value_per_sample":
                close_mmap_dataset_builder(result["sample_to_metric_builder"], result["sample_to_metric_fname"])
                for value in list(result["metric_to_sample_dict"]):
                    if result["metric_to_sample_dict"][value]:
                        self._flush(result, value)
            elif result["metric_value"] is not None:
                builder = create_mmap_dataset_builder(result["metric_value_fname"], dtype)
                builder.add_item(result["metric_value"].reshape(-1))
                close_mmap_dataset_builder(builder, result["metric_value_fname"])

    def run_map_helper(self, thread_id):
        start, end = self.thread_splits[thread_id]
        part = Subset(self.dataset, list(range(start, end)))
        loader = DataLoader(part, batch_sampler=BatchSampler(SequentialSampler(part), self.batch_size, False),
                            num_workers=0, collate_fn=self.collate_fn)
        args = (thread_id, self.metric_names, self.metric_types, self.metric_dtypes, self.save_path, self.worker_id)
        results = (self.custom_map_init or self.init_metric_results)(*args)
        update = self.custom_map_update or self.update_metric_results
        done = 0
        for data in loader:
            update(data, self.metric_types, self.metric_dtypes, self.metric_functions, results, start + done)
            done += len(data)
        (self.custom_map_finalize or self.finalize_metric_results)(self.metric_types, self.metric_dtypes, results)

    def run_map(self):
        workers = split_index(0, len(self.dataset), self.num_workers)
        self.worker_splits = workers
        self.thread_splits = split_index(*workers[self.worker_id], self.num_threads)
        threads = self.specific_threads or list(range(self.num_threads))
        if self.num_threads == 1:
            self.run_map_helper(0)
            return
        procs = [Process(target=self.run_map_helper, args=(t,)) for t in threads]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        failed = [t for t, p in zip(threads, procs) if p.exitcode != 0]
        if failed:
            raise RuntimeError(f"DataAnalyzer: map threads {failed} of worker {self.worker_id} failed")

    # --- reduce ---------------------------------------------------------------------------
    def _merged(self, fname, dtype, chunks):
        builder = create_mmap_dataset_builder(fname, dtype)
        for chunk in chunks:
            builder.merge_file_(chunk)
        close_mmap_dataset_builder(builder, fname)

    def _reduce_single(self, name, total):
        where = f"{self.save_path}/{name}/"
        pairs = [(w, t) for w in range(self.num_workers) for t in range(self.num_threads)]
        values, count = set(), 0
        for w, t in pairs:
            rows = MMapIndexedDataset(f"{self._dir(name, w, t)}/{name}_sample_to_metric")
            values |= set(np.unique(np.concatenate([rows[i] for i in range(len(rows))] or [np.zeros(0)])).tolist())
            count += len(rows)
        if count != total:
            raise RuntimeError(f"DataAnalyzer: the map results of {name} hold {count} samples, the dataset {total}: "
                               "a map worker did not finish")
        value_dtype = find_fit_int_dtype(min(values), max(values))
        sample_dtype = find_fit_int_dtype(0, total - 1)
        reduce_splits = split_index(0, len(pairs), self.num_threads_reduce)
        for r, (a, b) in enumerate(reduce_splits):
            builder = create_mmap_dataset_builder(f"{where}/{name}_sample_to_metric_thread{r}", value_dtype)
            for w, t in pairs[a:b]:
                rows = MMapIndexedDataset(f"{self._dir(name, w, t)}/{name}_sample_to_metric")
                for i in range(len(rows)):
                    builder.add_item_numpy(rows[i].astype(np.int64))
            close_mmap_dataset_builder(builder, f"{where}/{name}_sample_to_metric_thread{r}")
        self._merged(f"{where}/{name}_sample_to_metric", value_dtype,
                     [f"{where}/{name}_sample_to_metric_thread{r}" for r in range(self.num_threads_reduce)])
        ordered = sorted(values)
        for r, (a, b) in enumerate(split_index(0, len(ordered), self.num_threads_reduce)):
            samples_b = create_mmap_dataset_builder(f"{where}/{name}_index_to_sample_thread{r}", sample_dtype)
            metric_b = create_mmap_dataset_builder(f"{where}/{name}_index_to_metric_thread{r}", value_dtype)
            for value in ordered[a:b]:
                samples = []
                for w, t in pairs:
                    path = f"{self._dir(name, w, t)}/{name}_metric_to_sample_{value}.csv"
                    if os.path.isfile(path):
                        with open(path) as f:
                            for row in csv.reader(f):
                                samples += [int(x) for x in row]
                samples_b.add_item_numpy(np.asarray(samples, dtype=np.int64))
                metric_b.add_item_numpy(np.asarray([value], dtype=np.int64))
            close_mmap_dataset_builder(samples_b, f"{where}/{name}_index_to_sample_thread{r}")
            close_mmap_dataset_builder(metric_b, f"{where}/{name}_index_to_metric_thread{r}")
        for what, dtype in (("index_to_sample", sample_dtype), ("index_to_metric", value_dtype)):
            self._merged(f"{where}/{name}_{what}", dtype,
                         [f"{where}/{name}_{what}_thread{r}" for r in range(self.num_threads_reduce)])
        index = MMapIndexedDataset(f"{where}/{name}_index_to_sample")
        step = max(1, len(index) // 100)
        merged = create_mmap_dataset_builder(f"{where}/{name}_index_to_sample_percentile_merged", sample_dtype)
        for v in range(0, len(index), step):
            merged.add_item_numpy(np.concatenate(index[v:min(len(index), v + step)], axis=None).astype(np.int64))
        close_mmap_dataset_builder(merged, f"{where}/{name}_index_to_sample_percentile_merged")

    def _reduce_accumulated(self, name):
        total = None
        for w in range(self.num_workers):
            for t in range(self.num_threads):
                part = np.copy(MMapIndexedDataset(f"{self._dir(name, w, t)}/{name}_metric_value")[0])
                total = part.astype(np.int64) if total is None else total + part
        fname = f"{self.save_path}/{name}/{name}_metric_value"
        builder = create_mmap_dataset_builder(fname, find_fit_int_dtype(int(total.min()), int(total.max())))
        builder.add_item_numpy(total)
        close_mmap_dataset_builder(builder, fname)

    def merge_map_results(self, dataset, metric_names, metric_types, save_path, num_workers, num_threads,
                          num_threads_reduce):
        for name, kind in zip(metric_names, metric_types):
            if kind == "single_value_per_sample":
                self._reduce_single(name, len(dataset))
            else:
                self._reduce_accumulated(name)

    def run_reduce(self):
        args = (self.dataset, self.metric_names, self.metric_types, self.save_path, self.num_workers,
                self.num_threads, self.num_threads_reduce)
        (self.custom_reduce or self.merge_map_results)(*args)

    def run_map_reduce(self, comm_group=None):
        """Map on every worker, reduce on worker 0; collective over comm_group (a chorus process set) when given."""
        import chorus.torch as hvd
        self.run_map()
        barrier = (lambda: hvd.barrier(process_set=comm_group)) if comm_group is not None and hvd.is_initialized() \
            else (hvd.barrier if hvd.is_initialized() else (lambda: None))
        barrier()
        if self.worker_id == 0:
            self.run_reduce()
        barrier()
