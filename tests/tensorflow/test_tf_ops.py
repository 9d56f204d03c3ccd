"""chorus.tensorflow and chorus.tensorflow.keras under chorusrun: every op and its gradients, errors, dynamic sets."""
import pytest

from conftest import ok


@pytest.mark.parametrize("n", [1, 2, 3])
def test_every_op_eager_and_graph(ranks, n):
    out = ok(ranks(n, "ops.py", timeout=600))
    assert out.count("tf ops ok") == n


@pytest.mark.parametrize("n", [1, 3])
def test_gradients_are_horovods(ranks, n):
    out = ok(ranks(n, "grads.py"))
    assert out.count("tf grads ok") == n


def test_errors_are_tf_errors_with_chorus_message(ranks):
    proc = ranks(3, "errors.py", env={"CHORUS_TIMEOUT_SECONDS": "10"}, keep_going=True)
    assert "rank 1 was killed by signal 9" in proc.stdout, proc.stdout
    assert proc.stdout.count("UnknownError caught") == 2, proc.stdout


def test_dynamic_process_sets(ranks):
    out = ok(ranks(4, "dynamic_sets.py"))
    assert out.count("tf dynamic sets ok") == 4


def test_errors_of_horovods_types(ranks):
    out = ok(ranks(2, "horovod_errors_tf.py"))
    assert out.count("tf horovod errors ok") == 2, out


def test_horovod_api_pieces(ranks):
    out = ok(ranks(2, "tf_api.py"))
    assert out.count("tf api ok") == 2 and out.count("tf partial ok") == 2, out
    assert out.count("tf graph build ok") == 2, out


def test_broadcast_in_place_in_a_graph(ranks):
    out = ok(ranks(2, "graph_broadcast.py"))
    assert out.count("tf graph broadcast ok") == 2, out


def test_ranks_on_different_paths_fail_those_ops_and_go_on(ranks):
    out = ok(ranks(2, "diverged_tf.py", env={"CHORUS_BLOCKED_FAIL_SECONDS": "2"}, timeout=120))
    assert out.count("tf diverged ok") == 2, out


def test_ranks_on_different_paths_in_a_graph_end_on_the_stall_limit(ranks):
    env = {"CHORUS_BLOCKED_FAIL_SECONDS": "2", "CHORUS_STALL_SHUTDOWN_TIME_SECONDS": "4"}
    out = ok(ranks(2, "diverged_tf_graph.py", env=env, timeout=120))
    assert out.count("tf graph diverged stopped") == 2, out
