"""chorus.spark.common.store: Horovod's Store.create / LocalStore layout."""
import os

import pytest

from chorus.spark.common.store import LocalStore, Store


def test_a_local_path_makes_a_local_store_with_horovods_layout(tmp_path):
    store = Store.create(str(tmp_path / "work"))
    assert isinstance(store, LocalStore) and os.path.isdir(tmp_path / "work")
    root = str(tmp_path / "work")
    assert store.get_train_data_path(3) == os.path.join(root, "intermediate_train_data.3")
    assert store.get_val_data_path() == os.path.join(root, "intermediate_val_data")
    assert store.get_checkpoint_path("r1") == os.path.join(root, "runs", "r1", "checkpoint")
    assert store.get_logs_path("r1") == os.path.join(root, "runs", "r1", "logs")
    assert Store.create("file://" + root).prefix_path == root


def test_writes_are_whole_and_runs_sync(tmp_path):
    store = LocalStore(str(tmp_path))
    path = store.get_checkpoint_path("run")
    store.write(path, b"one")
    store.write(path, b"two")
    assert store.read(path) == b"two" and store.exists(path)
    assert [n for n in os.listdir(os.path.dirname(path)) if n.startswith(".tmp-")] == []
    local = tmp_path / "local"
    (local / "logs").mkdir(parents=True)
    (local / "logs" / "events").write_text("e")
    store.sync_fn("run")(str(local))
    assert (tmp_path / "runs" / "run" / "logs" / "events").read_text() == "e"


@pytest.mark.parametrize("url", ["hdfs://namenode/tmp", "dbfs:/x", "s3://bucket/p"])
def test_remote_schemes_are_refused_clearly(url):
    with pytest.raises(ValueError, match="not supported"):
        Store.create(url)
