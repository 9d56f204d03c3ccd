"""Elastic training of a DeepSpeed engine with chorus.torch.elastic's loop.

ZeRO partitions the model states over the ranks, so a rank that dies takes its
partition with it: a commit is a checkpoint in commit_dir (shared storage every
host reads, as DeepSpeed's checkpoints are), and after every reset the engine is
re-partitioned over the new world and loads the last commit.

    state = chorus.deepspeed.elastic.DeepSpeedState(engine, "/shared/ckpt", epoch=0)

    @hvd.elastic.run
    def train(state):
        ...                       # engine.backward(loss); engine.step(); state.commit()
"""
import os
import shutil

import chorus.torch as hvd
from chorus.deepspeed.runtime.zero import checkpoint
from chorus.torch.elastic.state import ObjectState


class DeepSpeedState(ObjectState):
    """An engine and plain values (epoch=..., batch=...), committed to commit_dir."""

    # Loading the commit is collective (every rank gathers its new partition), so it
    # happens in sync(), which every worker of a new round runs, survivors and newcomers.
    sync_after_every_reset = True

    def __init__(self, engine, commit_dir, keep=2, **kwargs):
        self.engine = engine
        self._dir = os.fspath(commit_dir)
        self._keep = max(1, int(keep))
        self._commits = 0
        super().__init__(**kwargs)

    def save(self):
        self._commits += 1
        self.engine.save_checkpoint(self._dir, tag=f"elastic_commit{self.engine.global_steps}_{self._commits}")
        if hvd.rank() == 0:  # older commits go once the new one is complete
            tags = sorted((t for t in os.listdir(self._dir) if t.startswith("elastic_commit")),
                          key=lambda t: os.path.getmtime(os.path.join(self._dir, t)))
            for t in tags[:-self._keep]:
                shutil.rmtree(os.path.join(self._dir, t), ignore_errors=True)
        super().save()

    def reset(self):
        self.engine._rebuild()  # partitioned for the new world; sync() loads the commit

    def sync(self):
        tag = checkpoint.resolve_tag(self._dir, None) if os.path.isdir(self._dir) else None
        if tag is None:  # nothing committed yet: everyone starts from rank 0's parameters
            hvd.broadcast_parameters(self.engine.module.state_dict(), root_rank=0)
        else:
            self.engine.load_checkpoint(self._dir, tag=tag)
        super().sync()
