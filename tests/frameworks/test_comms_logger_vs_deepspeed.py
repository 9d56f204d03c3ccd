"""The communication logger (a config's comms_logger section) under chorus and under
the real DeepSpeed 0.19.8 (workers/comms_log.py, 2 ranks): log_summary's table and
dict have DeepSpeed's layout; the program's own 5 all_reduce calls of 4 KiB are there
with their count under both; chorus's ZeRO engine's collectives are there too; and
each row's bandwidths follow from its size and latency as DeepSpeed computes them."""
import json

from conftest import chorusrun, real_deepspeed

HEADER = ["Comm. Op", "Message Size", "Count", "Total Latency(ms)", "Avg Latency(ms)", "tput_avg (Gbps)",
          "busbw_avg (Gbps)"]


def check_rows(summary, n):
    """Each row's numbers, as DeepSpeed's logger derives them from its records."""
    for name, sizes in summary.items():
        for size, row in sizes.items():
            assert row["count"] >= 1 and int(size) == row["msg_size_bytes"]
            assert row["total_latency_ms"] > 0 and row["avg_latency_ms"] > 0
            if row["count"] == 1:  # one record: the trimmed mean is it
                assert abs(row["total_latency_ms"] - row["avg_latency_ms"]) <= 1e-9 * row["total_latency_ms"]
            if name == "all_reduce":  # busbw = algbw (n-1)/n op by op, so for their trimmed means too
                assert abs(row["busbw_avg_gbps"] - row["tput_avg_gbps"] * (n - 1) / n) <= 1e-9 * row["tput_avg_gbps"]
                if row["count"] == 1:
                    algbw = int(size) * 2 / row["avg_latency_ms"] * 8 / 1e6
                    assert abs(row["tput_avg_gbps"] - algbw) <= 1e-6 * algbw


def test_comms_logger_summary_matches_deepspeeds(tmp_path):
    outs = {"deepspeed": real_deepspeed(2, "comms_log.py", tmp_path / "deepspeed.json"),
            "chorus": chorusrun(2, "comms_log.py", tmp_path / "chorus.json")}
    for who, out in outs.items():
        data = json.loads((tmp_path / f"{who}.json").read_text())
        assert data["world_size"] == 2
        summary = data["summary"]
        assert summary["all_reduce"]["4096"]["count"] == 5, (who, summary["all_reduce"])
        check_rows(summary, 2)
        header = next(line for line in out.splitlines() if "Comm. Op" in line)
        assert header.split("Comm. Op", 1)[1].split() and all(h in header for h in HEADER), header
    chorus = json.loads((tmp_path / "chorus.json").read_text())["summary"]
    # The ZeRO-2 engine's own collectives: its gradients' reduce-scatters and its parameters' allgathers.
    assert "reduce_scatter_tensor" in chorus and "all_gather_into_tensor" in chorus, sorted(chorus)
    assert sum(r["count"] for r in chorus["all_gather_into_tensor"].values()) >= 3
