"""The seed's Transformer split (8 ranks) and its priority lines.

The class's __init__ is the seed's, verbatim but for the import. Its forward()
is pseudo-code in the seed (it reads variables that exist only on other
ranks), so the forward here keeps the seed's collectives and hands each group
its input explicitly."""
import torch

import chorus.torch as hvd


# ---- seed ----
class DistributedTransformer:
    def __init__(self):
        # 初始化进程组
        self.embed_group = hvd.ProcessSet([0, 1])
        self.encoder_group = hvd.ProcessSet([2, 3])
        self.decoder_group = hvd.ProcessSet([4, 5])
        self.output_group = hvd.ProcessSet([6, 7])
        hvd.init(process_sets=[
            self.embed_group, self.encoder_group, self.decoder_group, self.output_group
        ])
# ---- end of seed ----

    def forward(self, input_ids):
        r = hvd.rank()
        x = torch.full((2, 4), float(r)) + input_ids
        if self.embed_group.included():
            return hvd.allgather(x, process_set=self.embed_group)
        if self.encoder_group.included():
            return hvd.allreduce(x, process_set=self.encoder_group)
        if self.decoder_group.included():
            return hvd.broadcast(x, root_rank=4, process_set=self.decoder_group)
        return hvd.allreduce(x, op=hvd.Max, process_set=self.output_group)


model = DistributedTransformer()
out = model.forward(torch.zeros(2, 4))
r = hvd.rank()
expect = {0: 0.0, 1: 0.0, 2: 2.5, 3: 2.5, 4: 4.0, 5: 4.0, 6: 7.0, 7: 7.0}[r]
assert out[0, 0].item() == expect, (r, out)

# The seed's priority lines: critical gradients first.
critical_group, non_critical_group = model.encoder_group, model.decoder_group
critical_gradients = torch.ones(3) * r
non_critical_gradients = torch.ones(3) * r
if critical_group.included():
    # ---- seed ----
    hvd.allreduce(critical_gradients, priority=1, process_set=critical_group)
if non_critical_group.included():
    hvd.allreduce(non_critical_gradients, priority=0, process_set=non_critical_group)
    # ---- end of seed ----
hvd.synchronize()
hvd.shutdown()
print(f"rank {r}: seed transformer ok")
