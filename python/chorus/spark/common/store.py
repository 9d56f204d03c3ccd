"""horovod.spark.common.store's names: where a Spark training job keeps its
intermediate data, checkpoints and logs. LocalStore covers a local or shared
(NFS, FUSE-mounted) file system; HDFS and DBFS are refused with a clear error."""
import os
import shutil
import tempfile
from urllib.parse import urlparse


class Store:
    """A prefix path with Horovod's layout: intermediate_train_data.<idx>,
    intermediate_val_data.<idx>, intermediate_test_data.<idx>, runs/<run_id>/
    (checkpoint file and logs/)."""

    def __init__(self, prefix_path):
        self.prefix_path = prefix_path

    @staticmethod
    def create(prefix_path, *args, **kwargs):
        """A LocalStore for a local path or file:// URL; other schemes are refused."""
        scheme = urlparse(prefix_path).scheme
        if scheme in ("", "file"):
            return LocalStore(prefix_path, *args, **kwargs)
        raise ValueError(f"Store.create({prefix_path!r}): chorus.spark stores only to a local or mounted file "
                         f"system (a path or file://); '{scheme}://' (HDFS, DBFS, S3) is not supported")

    def get_train_data_path(self, idx=None):
        return self._data_path("train", idx)

    def get_val_data_path(self, idx=None):
        return self._data_path("val", idx)

    def get_test_data_path(self, idx=None):
        return self._data_path("test", idx)

    def _data_path(self, kind, idx):
        name = f"intermediate_{kind}_data" + (f".{idx}" if idx is not None else "")
        return os.path.join(self.get_full_path(), name)

    def get_runs_path(self):
        return os.path.join(self.get_full_path(), "runs")

    def get_run_path(self, run_id):
        return os.path.join(self.get_runs_path(), run_id)

    def get_checkpoint_path(self, run_id):
        return os.path.join(self.get_run_path(run_id), self.get_checkpoint_filename())

    def get_logs_path(self, run_id):
        return os.path.join(self.get_run_path(run_id), self.get_logs_subdir())

    def get_checkpoint_filename(self):
        return "checkpoint"

    def get_logs_subdir(self):
        return "logs"

    def get_full_path(self):
        raise NotImplementedError


class LocalStore(Store):
    """A Store on this machine's (or a shared) file system."""

    def __init__(self, prefix_path, *args, **kwargs):
        path = urlparse(prefix_path).path if prefix_path.startswith("file://") else prefix_path
        super().__init__(os.path.abspath(path))
        os.makedirs(self.prefix_path, exist_ok=True)

    def get_full_path(self):
        return self.prefix_path

    def exists(self, path):
        return os.path.exists(path)

    def read(self, path):
        with open(path, "rb") as f:
            return f.read()

    def write(self, path, data):
        """Writes atomically: a reader sees the old file or the whole new one."""
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data if isinstance(data, bytes) else data.encode())
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise

    def sync_fn(self, run_id):
        """A function that copies a local run folder into the store's run path."""
        run_path = self.get_run_path(run_id)

        def sync(local_run_path):
            shutil.copytree(local_run_path, run_path, dirs_exist_ok=True)
        return sync


def HDFSStore(*args, **kwargs):  # noqa: N802 - Horovod's class name
    raise ValueError("chorus.spark: HDFSStore is not supported; use a LocalStore on a mounted file system")


def DBFSLocalStore(*args, **kwargs):  # noqa: N802 - Horovod's class name
    raise ValueError("chorus.spark: DBFSLocalStore is not supported; use a LocalStore on /dbfs's mount")
