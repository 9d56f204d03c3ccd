"""checkpoint.use_node_local_storage on 2 namespace hosts x 2 ranks (workers/node_local_ckpt.py):
each node's own folder holds the model states and only its own ranks' shards (stage 2),
or stage 0's one shard, and the job resumes from them as it was."""
import os
import subprocess

import pytest

from conftest import WORKERS, chorusrun

pytestmark = pytest.mark.usefixtures("bed")


@pytest.mark.parametrize("stage", [0, 2])
def test_each_node_saves_and_resumes_from_its_own_disk(bed, env, tmp_path, stage):
    tmp_path.chmod(0o777)
    proc = bed.run("node1", [chorusrun(), "-np", "4", "-H", "node1:2,node2:2", *bed.ssh_args(), "python",
                             os.path.join(WORKERS, "node_local_ckpt.py"), str(tmp_path), str(stage)],
                   env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout
    for r in range(4):
        assert f"node-local rank {r} on node{r // 2 + 1}: resumed as it was" in proc.stdout, proc.stdout
    assert sorted(os.listdir(tmp_path)) == ["node1", "node2"]
