"""chorus.tensorflow and chorus.tensorflow.keras under chorusrun: the seed program, elastic Keras."""

from conftest import ok


import pytest


@pytest.mark.parametrize("keras", ["keras3", "keras2"])
def test_seed_program_trains_with_only_the_import_changed(ranks, tmp_path, monkeypatch, keras):
    """The seed's TensorFlow example on 2 ranks: 10 epochs, then evaluated on held-out
    digits; under Keras 3 and under Keras 2 (tf_keras, TF_USE_LEGACY_KERAS=1)."""
    import os
    import re
    monkeypatch.chdir(tmp_path)  # its checkpoint goes to ./checkpoint
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          "examples", "tensorflow", "seed_mnist.py")
    env = {"TF_USE_LEGACY_KERAS": "1"} if keras == "keras2" else {}
    out = ok(ranks(2, script, env=env, timeout=600))
    assert "data: " in out
    accuracies = [float(a) for a in re.findall(r"Accuracy: ([0-9.]+)", out)]
    assert len(accuracies) == 2 and min(accuracies) > 0.8, out[-3000:]
    # Keras 2's ModelCheckpoint(save_best_only=True) skips saving without val_loss
    # (the seed passes no validation data); Keras 3's saves.
    assert (tmp_path / "checkpoint" / "mnist_model.h5").exists() == (keras == "keras3")


def test_elastic_keras_state_across_a_new_worker(tmp_path):
    """hvd.elastic.run + TensorFlowKerasState under chorusrun's elastic driver."""
    import os
    import subprocess
    import sys
    from conftest import BUILD, WORKERS
    listing = tmp_path / "hosts"
    listing.write_text("localhost:2\n")
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {listing}\n")
    script.chmod(0o755)
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, "python"), TF_CPP_MIN_LOG_LEVEL="2",
               CHORUS_STALL_SHUTDOWN_TIME_SECONDS="30", OMP_NUM_THREADS="1")
    cmd = [os.path.join(BUILD, "chorusrun"), "--min-np", "2", "--max-np", "3", "--host-discovery-script",
           str(script), "--elastic-timeout", "30", sys.executable, os.path.join(WORKERS, "elastic_keras.py"),
           str(listing)]
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.count("reset to 3 workers at epoch 1") == 2, proc.stdout
    assert proc.stdout.count("elastic keras done on 3 workers at epoch 3") == 3, proc.stdout



def test_elastic_states_restore_what_was_synced(ranks):
    out = ok(ranks(2, "elastic_state_sync.py"))
    assert out.count("tf state sync ok") == 2, out
