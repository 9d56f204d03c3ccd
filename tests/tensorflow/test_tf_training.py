"""chorus.tensorflow and chorus.tensorflow.keras under chorusrun: the optimizers, the Keras callbacks, mixed precision."""
import pytest

from conftest import ok


@pytest.mark.parametrize("n", [2, 3])
def test_optimizers_match_one_process_on_the_global_batch(ranks, n):
    out = ok(ranks(n, "optimizer.py", timeout=600))
    assert out.count("tf optimizer ok") == n


@pytest.mark.parametrize("n", [2, 3])
def test_keras_callbacks(ranks, n, tmp_path):
    out = ok(ranks(n, "callbacks.py", str(tmp_path), timeout=600))
    assert out.count("tf callbacks ok") == n
    assert "finished gradual learning rate warmup to 0.1" in out

def test_mixed_precision(ranks):
    out = ok(ranks(2, "mixed_precision.py", timeout=600))
    assert out.count("tf mixed precision ok") == 2



@pytest.mark.parametrize("n", [2, 3])
def test_replicas_agree_after_uneven_data(ranks, n):
    out = ok(ranks(n, "uneven_fit.py", timeout=600))
    assert out.count("tf uneven ok") == n, out


def test_keras2_through_tf_keras(ranks, tmp_path):
    """TF_USE_LEGACY_KERAS=1: tf.keras is Keras 2 (tf_keras); the optimizer wrapper,
    callbacks, elastic state and load_model work on it as on Keras 3."""
    out = ok(ranks(2, "keras2.py", str(tmp_path), env={"TF_USE_LEGACY_KERAS": "1"}, timeout=300))
    assert out.count("keras 2 ok") == 2, out


@pytest.mark.parametrize("legacy", ["0", "1"], ids=["keras3", "keras2"])
def test_sync_batch_normalization_matches_the_whole_batch(ranks, legacy):
    out = ok(ranks(2, "sync_bn.py", env={"TF_USE_LEGACY_KERAS": legacy}, timeout=300))
    assert out.count("sync bn ok") == 2, out
