"""per_head_muon's pieces: the update of a matrix of heads is each head's block
orthogonalized on its own with one head's aspect ratio, and the tagging finds the heads
of query, key/value (grouped) and MLA projections from the model config, leaves fused and
output projections whole, follows a tensor-parallel shard's rows, and refuses a model
where it would change nothing."""
import types

import pytest
import torch

from chorus.deepspeed.ops.muon import aspect_scale, muon_update, orthogonalize
from chorus.deepspeed.runtime import muon
from chorus.deepspeed.runtime.muon_heads import heads_of, tag


def test_per_head_update_is_each_heads_own():
    gen = torch.Generator().manual_seed(0)
    grad, momentum = torch.randn(12, 8, generator=gen), torch.randn(12, 8, generator=gen)
    update = grad.lerp(momentum.lerp(grad, 0.1), 0.9)  # (Nesterov: what muon_update orthogonalizes)
    got = muon_update(grad.clone(), momentum.clone(), beta=0.9, num_heads=3, ns_method="gram")
    for h in range(3):
        want = orthogonalize(update[4 * h:4 * h + 4], 5, "gram").float() * aspect_scale(4, 8)
        assert torch.allclose(got[4 * h:4 * h + 4], want, atol=1e-4), h
    whole = muon_update(grad.clone(), momentum.clone(), beta=0.9, ns_method="gram")
    assert not torch.allclose(got, whole, atol=1e-2)
    with pytest.raises(ValueError, match="5 heads"):
        muon_update(grad.clone(), momentum.clone(), num_heads=5)


class Block(torch.nn.Module):
    def __init__(self, q_rows):
        super().__init__()
        self.q_proj = torch.nn.Linear(32, q_rows, bias=False)
        self.k_proj = torch.nn.Linear(32, 16, bias=False)  # 2 kv heads of 8
        self.qkv_proj = torch.nn.Linear(32, 96, bias=False)  # fused: whole
        self.o_proj = torch.nn.Linear(32, 32, bias=False)  # heads on the columns: whole
        self.kv_b_proj = torch.nn.Linear(32, 4 * (3 + 5), bias=False)  # MLA: 4 heads of nope 3 + v 5


class Model(torch.nn.Module):
    def __init__(self, q_rows=32, **extra):
        super().__init__()
        self.config = types.SimpleNamespace(num_attention_heads=4, num_key_value_heads=2, hidden_size=32,
                                            qk_nope_head_dim=3, qk_rope_head_dim=1, v_head_dim=5, **extra)
        self.self_attn = Block(q_rows)
        self.embed = torch.nn.Embedding(10, 32)


def tagged(model):
    muon.mark(model)
    tag(model, lambda p: p.shape)
    return {n: getattr(p, "muon_head_dim") for n, p in model.named_parameters()}


def test_heads_come_from_the_config_and_the_shape():
    dims = tagged(Model(head_dim=8))
    assert dims["self_attn.q_proj.weight"] == 8 and dims["self_attn.k_proj.weight"] == 8
    assert dims["self_attn.kv_b_proj.weight"] == 8
    assert dims["self_attn.qkv_proj.weight"] is None and dims["self_attn.o_proj.weight"] is None
    assert dims["embed.weight"] is None
    # q_proj with rows = 4 x (nope + rope) is MLA's query up-projection: heads of 4.
    assert tagged(Model(q_rows=16))["self_attn.q_proj.weight"] == 4
    # A shard with half the rows holds half the heads; one that cuts a head holds none.
    p = Model(head_dim=8).self_attn.q_proj.weight
    p.muon_head_dim = 8
    assert heads_of(p, 16) == 2 and heads_of(p, 12) is None


def test_nothing_to_split_is_refused():
    plain = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    muon.mark(plain)
    with pytest.raises(ValueError, match="per_head_muon"):
        tag(plain, lambda p: p.shape)
