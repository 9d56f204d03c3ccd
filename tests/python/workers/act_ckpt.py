"""Activation checkpointing (deepspeed.checkpointing) on 2 tensor-parallel ranks:
the same gradients as without it (dropout too: the recomputation replays the RNG),
less memory kept for the backward pass (bytes autograd saves, measured with
saved-tensor hooks), and with partition_activations each rank keeps half of
every checkpointed input."""
import torch
import torch.nn.functional as F

import chorus.deepspeed as deepspeed
from chorus.parallel import ColumnParallelLinear, RowParallelLinear, mpu
import chorus.torch as hvd

deepspeed.init_distributed()
mpu.initialize_model_parallel(tensor_model_parallel_size=hvd.size())


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = ColumnParallelLinear(32, 128, gather_output=False)
        self.down = RowParallelLinear(128, 32, input_is_parallel=True)

    def forward(self, h):
        return h + F.dropout(self.down(torch.tanh(self.up(h))), p=0.2, training=True)


torch.manual_seed(0)
blocks = torch.nn.ModuleList([Block() for _ in range(4)])
x = torch.randn(64, 32)


def run(ckpt):
    """Loss gradient and the bytes autograd kept, with or without checkpointing."""
    kept = [0]

    def pack(t):
        kept[0] += t.numel() * t.element_size()
        return t
    blocks.zero_grad()
    inp = x.clone().requires_grad_()
    torch.manual_seed(7)  # the dropout masks
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        h = inp
        for b in blocks:
            h = deepspeed.checkpointing.checkpoint(b, h) if ckpt else b(h)
        loss = h.pow(2).sum()
    loss.backward()
    return [p.grad.clone() for p in blocks.parameters()] + [inp.grad.clone()], kept[0], float(loss)


plain, plain_bytes, plain_loss = run(False)
deepspeed.checkpointing.configure(mpu, deepspeed_config={"activation_checkpointing": {}})
ckpt, ckpt_bytes, ckpt_loss = run(True)
deepspeed.checkpointing.configure(mpu, deepspeed_config={"activation_checkpointing": {"partition_activations": True}})
part, part_bytes, part_loss = run(True)
assert plain_loss == ckpt_loss == part_loss, (plain_loss, ckpt_loss, part_loss)
for a, b, c in zip(plain, ckpt, part):
    assert torch.allclose(a, b, rtol=1e-6, atol=1e-7) and torch.allclose(a, c, rtol=1e-6, atol=1e-7)
# Checkpointed: each block keeps its input (64 x 32 floats) and nothing inside it;
# the loss keeps the last output.
act = 64 * 32 * 4
assert ckpt_bytes == 4 * act + act and plain_bytes > 3 * ckpt_bytes, (plain_bytes, ckpt_bytes)
assert part_bytes == 4 * act // hvd.size() + act, (part_bytes, ckpt_bytes)
try:
    deepspeed.checkpointing.configure(None, deepspeed_config={"activation_checkpointing": {"partition_activation": True}})
    raise SystemExit("a misspelt option was accepted")
except ValueError as e:
    assert "partition_activation" in str(e)
print(f"rank {hvd.rank()}: checkpointing ok, kept {plain_bytes} -> {ckpt_bytes} -> {part_bytes} bytes", flush=True)
