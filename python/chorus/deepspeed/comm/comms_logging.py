"""DeepSpeed's communication logger (its comms_logger config section): per collective
and message size, the count, latencies, algorithmic and bus bandwidth, printed by
deepspeed.comm.log_summary(). The records come from chorus's own op log (every
collective chorus runs, the ZeRO engine's included, timed from the start of the
collective that carried it to its end) and from timing the deepspeed.comm calls that
go to torch.distributed."""
import math
import statistics
import time
from datetime import datetime

import torch

from chorus import _core

# chorus's op names as DeepSpeed's comm API names them.
_NAMES = {"allreduce": "all_reduce", "allgather": "all_gather_into_tensor", "reducescatter": "reduce_scatter_tensor",
          "broadcast": "broadcast", "alltoall": "all_to_all_single", "barrier": "barrier"}


def convert_size(size_bytes):
    if size_bytes == 0:
        return "0B"
    names = ("B", "KB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB")
    i = int(math.floor(math.log(size_bytes, 1024)))
    return f"{round(size_bytes / math.pow(1024, i), 2)} {names[i]}"


def calc_bw_log(comm_op, size, duration, n):
    """(algorithmic, bus) bandwidth in Gbps of size bytes in duration ms over n ranks, as nccl-tests counts them."""
    if duration <= 0:
        return 0.0, 0.0
    if comm_op in ("all_to_all_single", "all_to_all"):
        tput, busbw = size / duration, size / duration * ((n - 1) / n)
    elif comm_op in ("all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor"):
        size *= n
        tput, busbw = size / duration, size / duration * ((n - 1) / n)
    elif comm_op in ("all_reduce", "all_reduce_coalesced", "inference_all_reduce"):
        tput, busbw = size * 2 / duration, size / duration * (2 * (n - 1) / n)
    else:
        tput = busbw = size / duration
    return tput * 8 / 1e6, busbw * 8 / 1e6  # bytes per ms -> Gbps


def trim_mean(data, trim_percent):
    if not data:
        return 0
    data = sorted(data)
    k = int(round(len(data) * trim_percent))
    return statistics.fmean(data[k:len(data) - k])


class CommsLogger:
    def __init__(self):
        self.comms_dict = {}
        self.enabled, self.verbose, self.debug, self.prof_all, self.prof_ops = False, False, False, True, []

    def configure(self, section):
        """section: the config's comms_logger (DeepSpeed turns the logger on by its presence)."""
        self.enabled = section is not None
        if self.enabled:
            self.verbose = bool(section.get("verbose", False))
            self.debug = bool(section.get("debug", False))
            self.prof_all = bool(section.get("prof_all", True))
            self.prof_ops = list(section.get("prof_ops", []))
        self._listen()

    def _listen(self):
        if _core.is_initialized():
            _core.set_op_log(self.enabled)

    def start_profiling_comms(self):
        self.prof_all = True

    def stop_profiling_comms(self):
        self.prof_all = False

    def start_profiling_op(self, op_name_list):
        self.prof_ops = list(set(self.prof_ops) | set(op_name_list))

    def stop_profiling_op(self, op_name_list):
        self.prof_ops = [op for op in self.prof_ops if op not in op_name_list]

    def profiles(self, name):
        return self.enabled and (self.prof_all or name in self.prof_ops)

    def append(self, raw_name, record_name, latency, msg_size, n):
        algbw, busbw = calc_bw_log(raw_name, msg_size, latency, n)
        row = self.comms_dict.setdefault(record_name, {}).setdefault(msg_size, [0, [], [], []])
        row[0] += 1
        row[1].append(latency)
        row[2].append(algbw)
        row[3].append(busbw)
        if self.verbose:
            from chorus.deepspeed.comm import get_rank
            if get_rank() == 0:
                print(f"comm op: {record_name} | time (ms): {latency:.2f} | msg size: {convert_size(msg_size)} | "
                      f"algbw (Gbps): {algbw:.2f} | busbw (Gbps): {busbw:.2f}", flush=True)

    def drain(self, settle=True):
        """chorus's op log since the last drain, into the records (settle: after the records of
        collectives just completing; the per-step drains do not wait for them)."""
        if not self.enabled or not _core.is_initialized():
            return
        for op, nbytes, seconds, n, _ in _core.take_op_log(settle):
            name = _NAMES.get(op)
            if name is None or not self.profiles(name):
                continue
            size = nbytes // n if name == "reduce_scatter_tensor" else nbytes  # per rank, as DeepSpeed counts it
            self.append(name, name, seconds * 1e3, size, n)

    def timed(self, name, size, n):
        """A context for one deepspeed.comm call that goes to torch.distributed."""
        logger = self

        class _Timed:
            def __enter__(self):
                self.t0 = time.perf_counter()

            def __exit__(self, *exc):
                if torch.cuda.is_available() and torch.cuda.is_initialized():
                    torch.cuda.synchronize()  # (as DeepSpeed's logger: the op's time, not its launch's)
                if exc[0] is None and logger.profiles(name):
                    logger.append(name, name, (time.perf_counter() - self.t0) * 1e3, size, n)
        return _Timed()

    # DeepSpeed's queries of the records.
    def get_raw_data(self):
        self.drain()
        return self.comms_dict.copy()

    def has_data(self):
        self.drain()
        return bool(self.comms_dict)

    def reset_data(self):
        self.drain()
        self.comms_dict.clear()

    def get_operation_names(self):
        self.drain()
        return list(self.comms_dict)

    def get_total_operations(self):
        self.drain()
        return sum(v[0] for sizes in self.comms_dict.values() for v in sizes.values())

    def _row(self, msg_size, vals):
        return {"count": vals[0], "total_latency_ms": sum(vals[1]), "avg_latency_ms": trim_mean(vals[1], 0.1),
                "tput_avg_gbps": trim_mean(vals[2], 0.1), "busbw_avg_gbps": trim_mean(vals[3], 0.1),
                "msg_size_bytes": msg_size, "msg_size_str": convert_size(msg_size)}

    def get_operation_summary(self, operation_name):
        self.drain()
        sizes = self.comms_dict.get(operation_name)
        return None if sizes is None else {m: self._row(m, v) for m, v in sizes.items()}

    def log_all(self, print_log=True, show_straggler=False, return_dict=False):
        self.drain()
        from chorus.deepspeed import comm as dist
        result = {"summary": {}, "straggler_analysis": None,
                  "metadata": {"world_size": dist.get_world_size(), "rank": dist.get_rank(),
                               "timestamp": datetime.now().isoformat()}}
        heads = ("Comm. Op", "Message Size", "Count", "Total Latency(ms)", "Avg Latency(ms)", "tput_avg (Gbps)",
                 "busbw_avg (Gbps)")
        if print_log:
            print("".join(f"{h: <20}" for h in heads))
        for name, sizes in self.comms_dict.copy().items():
            if print_log:
                print(name)
            result["summary"][name] = {}
            for msg_size, vals in sorted(sizes.items()):
                row = self._row(msg_size, vals)
                result["summary"][name][msg_size] = row
                if print_log:
                    print(f"{' ': <20}{row['msg_size_str']: <20}{row['count']: <20}{row['total_latency_ms']: <20.2f}"
                          f"{row['avg_latency_ms']: <20.2f}{row['tput_avg_gbps']: <20.2f}"
                          f"{row['busbw_avg_gbps']: <20.2f}")
        if show_straggler:
            result["straggler_analysis"] = self._stragglers(print_log)
        return result if return_dict else None

    def _stragglers(self, print_log):
        """Each op's latency against the fastest rank's (a MIN allreduce of the latencies)."""
        import torch
        from chorus.deepspeed import comm as dist
        out = {}
        if print_log:
            print("_______________________________\nBreakdown with straggler effect\n-------------------------------")
            heads = ("Comm. Op", "Message Size", "Count", "Total comm lat(ms)", "Total straggler(ms)",
                     "Avg comm lat(ms)", "Avg straggler(ms)")
            print("".join(f"{h: <20}" for h in heads))
        for name, sizes in self.comms_dict.copy().items():
            out[name] = {}
            if print_log:
                print(name)
            for msg_size, vals in sorted(sizes.items()):
                lats = torch.tensor(vals[1], dtype=torch.float64)
                fastest = lats.clone()
                dist.all_reduce(fastest, op=dist.ReduceOp.MIN)
                extra = (lats - fastest).tolist()
                row = {"count": vals[0], "total_comm_lat_ms": fastest.sum().item(), "total_straggler_ms": sum(extra),
                       "avg_comm_lat_ms": trim_mean(fastest.tolist(), 0.1), "avg_straggler_ms": trim_mean(extra, 0.1),
                       "msg_size_bytes": msg_size, "msg_size_str": convert_size(msg_size)}
                out[name][msg_size] = row
                if print_log:
                    print(f"{' ': <20}{row['msg_size_str']: <20}{row['count']: <20}{row['total_comm_lat_ms']: <20.2f}"
                          f"{row['total_straggler_ms']: <20.2f}{row['avg_comm_lat_ms']: <20.2f}"
                          f"{row['avg_straggler_ms']: <20.2f}")
        return out
