"""Random-LTD's token operations: each layer keeps reserved_length tokens of every
sequence, drawn uniformly without replacement and kept in order; the layer runs on those
and its outputs go back to their places, the other tokens passing it by."""
import torch


def _sample(reserved_length, seq_length, batch_size, layers, device):
    """[layers, batch, reserved_length] sorted token indices (int32, as DeepSpeed's)."""
    weights = torch.ones((layers * batch_size, seq_length), device=device)
    picked = torch.multinomial(weights, reserved_length).sort(dim=-1).values
    return picked.reshape(layers, batch_size, reserved_length).to(torch.int32)


def gpt_sample_tokens(reserved_length, seq_length, batch_size, layers=1, device="cpu", attn_mask=None):
    """Decoder layers: the kept tokens' causal mask is the first reserved_length square of it."""
    indices = _sample(reserved_length, seq_length, batch_size, layers, device)
    return indices, None if attn_mask is None else attn_mask[:, :, :reserved_length, :reserved_length]


def bert_sample_tokens(reserved_length, seq_length, batch_size, layers=1, device="cpu", attn_mask=None):
    """Encoder layers: each layer's mask keeps the kept tokens' rows and columns."""
    if attn_mask is None:
        raise ValueError("random-LTD in an encoder needs the attention mask (random_ltd.model_mask_name)")
    indices = _sample(reserved_length, seq_length, batch_size, layers, device)
    long = indices.long()
    masks = []
    for layer in range(layers):
        rows = [attn_mask[i:i + 1, :, long[layer][i], :][:, :, :, long[layer][i]] for i in range(batch_size)]
        masks.append(torch.cat(rows, dim=0))
    return indices, masks


def _index(indices, batch_first, hidden):
    """indices [batch, kept] expanded to index hidden [batch, seq, h] (or [seq, batch, h])."""
    idx = indices.long()
    if not batch_first:
        idx = idx.t()
    return idx.unsqueeze(-1).expand(*idx.shape, hidden)


def token_gather(activations, indices, batch_first):
    dim = 1 if batch_first else 0
    return activations.gather(dim, _index(indices, batch_first, activations.size(-1)))


def token_scatter(all_activations, layer_activations, indices, batch_first):
    dim = 1 if batch_first else 0
    return all_activations.scatter(dim, _index(indices, batch_first, all_activations.size(-1)), layer_activations)


class GatherTokens(torch.autograd.Function):
    """(activations, the kept tokens' activations); the kept ones' gradients go back to their places."""

    @staticmethod
    def forward(ctx, activations, sorted_indices, batch_first):
        ctx.save_for_backward(sorted_indices)
        ctx.batch_first = batch_first
        return activations, token_gather(activations, sorted_indices, batch_first)

    @staticmethod
    def backward(ctx, a_gradients, g_gradients):
        indices, = ctx.saved_tensors
        grads = token_scatter(a_gradients, g_gradients.contiguous(), indices, ctx.batch_first)
        return grads, None, None


class ScatterTokens(torch.autograd.Function):
    """all_activations with the layer's outputs put back at the kept tokens' places."""

    @staticmethod
    def forward(ctx, all_activations, layer_activations, sorted_indices, batch_first):
        ctx.save_for_backward(sorted_indices)
        ctx.batch_first = batch_first
        return token_scatter(all_activations, layer_activations, sorted_indices, batch_first)

    @staticmethod
    def backward(ctx, out_gradients):
        indices, = ctx.saved_tensors
        out_gradients = out_gradients.contiguous()
        return out_gradients, token_gather(out_gradients, indices, ctx.batch_first), None, None
