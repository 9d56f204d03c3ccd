"""chorus.torch under chorusrun: collectives, autograd, optimizer, helpers, errors."""
import os
import re

import pytest

from conftest import have_mpi, ok


@pytest.mark.parametrize("n", [1, 2, 3])
def test_collectives(ranks, n):
    out = ok(ranks(n, "collectives.py"))
    assert out.count("collectives ok") == n


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_adasum(ranks, n):
    out = ok(ranks(n, "adasum.py"))
    assert out.count("adasum ok") == n


def test_elastic_state_and_sampler(ranks):
    out = ok(ranks(3, "elastic_api.py"))
    assert out.count("elastic api ok") == 3


def test_autograd(ranks):
    out = ok(ranks(3, "autograd.py"))
    assert out.count("autograd ok") == 3


def test_distributed_optimizer(ranks):
    out = ok(ranks(2, "optimizer.py"))
    assert out.count("optimizer ok") == 2


def test_distributed_optimizer_gradient_priorities(ranks, tmp_path):
    out = ok(ranks(2, "optimizer_priority.py", str(tmp_path / "trace.json")))
    assert out.count("optimizer priority ok") == 2


def test_broadcast_helpers(ranks):
    out = ok(ranks(3, "helpers.py"))
    assert out.count("helpers ok") == 3


def test_mismatch_names_the_tensor(ranks):
    out = ok(ranks(3, "errors.py"))
    assert out.count("mismatch ok") == 3


def test_peer_failure_raises_horovod_internal_error(ranks):
    proc = ranks(3, "peer_failure.py", env={"CHORUS_TIMEOUT_SECONDS": "10"}, keep_going=True)
    assert "rank 1 was killed by signal 9" in proc.stdout, proc.stdout
    assert proc.stdout.count("HorovodInternalError caught") == 2, proc.stdout


def test_join_while_others_run_every_collective(ranks):
    out = ok(ranks(3, "join.py"))
    assert out.count("join ok") == 3


def test_timeline_of_a_killed_job_is_valid_json(ranks, tmp_path):
    import json
    trace = tmp_path / "killed.json"
    proc = ranks(2, "timeline_killed.py", env={"CHORUS_TIMELINE": str(trace), "CHORUS_TIMEOUT_SECONDS": "10"},
                 keep_going=True)
    assert "rank 0 was killed by signal 9" in proc.stdout, proc.stdout
    events = json.loads(trace.read_text())  # no repair: valid as the killed rank left it
    names = {e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    assert {"allreduce.before.kill.0", "allreduce.before.kill.1", "allreduce.before.kill.2"} <= names, names
    assert any(e.get("name") == e.get("args", {}).get("transport", "") + "_ALLREDUCE" for e in events)


def test_timeline(ranks, tmp_path):
    out = ok(ranks(2, "timeline.py", str(tmp_path / "trace.json"),
                   env={"HOROVOD_TIMELINE": str(tmp_path / "at_init.json")}))
    assert out.count("timeline ok") == 2
    assert sorted(os.listdir(tmp_path)) == ["at_init.json", "trace.json"]  # nothing else left


def test_digits_main_job(ranks, tmp_path):
    import os
    from conftest import REPO
    proc = ranks(2, os.path.join(REPO, "examples", "pytorch", "digits.py"),
                 "--checkpoint-dir", str(tmp_path))
    out = ok(proc)
    acc = float(re.search(r"test accuracy ([0-9.]+)", out).group(1))
    assert acc > 0.95, out
    assert (tmp_path / "digits.pt").exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".digits")]  # no temp files left


@pytest.mark.parametrize("script,n", [("seed_static.py", 6), ("seed_dynamic.py", 8),
                                      ("seed_transformer.py", 8)])
def test_seed_examples(ranks, script, n):
    out = ok(ranks(n, script))
    assert out.count("ok") >= n, out


mpi = pytest.mark.skipif(not have_mpi(), reason="needs Open MPI, mpi4py and an MPI build")


@mpi
def test_seed_mpi_example_under_mpirun(ranks):
    out = ok(ranks(4, "seed_mpi.py", mpirun=True))
    assert out.count("seed mpi ok") == 4


@mpi
def test_process_sets_from_communicators_as_horovod_orders_and_refuses_them(ranks):
    out = ok(ranks(4, "comm_sets.py", mpirun=True))
    assert out.count("comm sets ok") == 4, out


@mpi
@pytest.mark.parametrize("data_path", ["auto", "mpi"])
def test_collectives_under_mpirun(ranks, data_path):
    out = ok(ranks(3, "collectives.py", mpirun=True, env={"CHORUS_CPU_OPERATIONS": data_path}))
    assert out.count("collectives ok") == 3


@mpi
def test_join_over_mpi_data_path(ranks):
    out = ok(ranks(3, "join.py", mpirun=True, env={"CHORUS_CPU_OPERATIONS": "mpi"}))
    assert out.count("join ok") == 3


@mpi
def test_dynamic_sets_from_split_communicators(ranks):
    out = ok(ranks(4, "mpi_dynamic.py", mpirun=True))
    assert out.count("mpi dynamic ok") == 4


def test_missing_gradients_reduce_as_zeros(ranks):
    out = ok(ranks(2, "uneven_grads.py", timeout=120))
    assert out.count("uneven ok") == 2


def test_every_dtype_in_every_collective(ranks):
    out = ok(ranks(3, "dtypes.py", timeout=120))
    assert out.count("dtypes ok") == 3


def test_horovod_names_build_queries_sparse_and_sync_batch_norm(ranks):
    out = ok(ranks(3, "api_names.py", timeout=120))
    assert out.count("api ok") == 3


def test_sigint_and_signal_handlers_interrupt_a_blocked_collective(ranks):
    out = ok(ranks(2, "interrupt.py", timeout=120))
    assert "handler interrupted" in out and "SIGINT interrupted the blocking call" in out
    assert "SIGINT interrupted synchronize" in out and out.count("interrupt ok") == 2


def test_ranks_on_different_paths_fail_those_ops_and_go_on(ranks):
    out = ok(ranks(2, "diverged_paths.py", env={"CHORUS_BLOCKED_FAIL_SECONDS": "2"}, timeout=120))
    assert out.count("diverged paths ok") == 2


def test_stall_shutdown_fails_a_blocked_call(ranks):
    out = ok(ranks(2, "stall_shutdown.py", env={"CHORUS_STALL_SHUTDOWN_TIME_SECONDS": "2"}, timeout=120))
    assert out.count("stall shutdown ok") == 2


@pytest.mark.parametrize("n", [2, 3, 4])
def test_point_to_point(ranks, n):
    out = ok(ranks(n, "p2p.py"))
    assert out.count("p2p ok") == n


def test_point_to_point_dead_peer(ranks):
    # The timeout is far away: the failure must come from the closed connection.
    proc = ranks(2, "p2p_peer_death.py", env={"CHORUS_TIMEOUT_SECONDS": "60"}, keep_going=True)
    m = re.search(r"rank 0: peer failure after ([\d.]+) s", proc.stdout)
    assert m and float(m.group(1)) < 10, proc.stdout


def test_point_to_point_carried_by_mpi(ranks):
    # Two simulated hosts under mpirun with CHORUS_CPU_OPERATIONS=mpi: large
    # messages between the hosts move by MPI, the rest as usual.
    out = ok(ranks(3, "p2p.py", mpirun=True, env={"CHORUS_CPU_OPERATIONS": "mpi", "P2P_TWO_HOSTS": "1"}))
    assert out.count("p2p ok") == 3


def test_stats_and_prometheus_metrics(ranks):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = ok(ranks(2, "metrics.py", env={"CHORUS_METRICS_PORT": str(port), "CHORUS_LOG_LEVEL": "info"}))
    assert out.count("metrics ok") == 2, out
    # info says where the metrics are and which path each process set took
    assert "metrics: Prometheus text on http://127.0.0.1:" in out, out
    assert "process set 0: 2 ranks on 1 host(s), data path SHM" in out, out
