"""The tensor-parallel model the tensor-parallel workers share: a vocabulary-parallel
embedding, column- and row-parallel linears, the vocabulary-parallel cross-entropy; each
layer seeded, so that a plain model seeded alike holds the same weights."""
import torch
import torch.nn.functional as F

from chorus.parallel import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, \
    vocab_parallel_cross_entropy

VOCAB, DIM, HIDDEN = 16, 8, 12


class Parallel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.embed = VocabParallelEmbedding(VOCAB, DIM)
        torch.manual_seed(2)
        self.up = ColumnParallelLinear(DIM, HIDDEN, gather_output=False)
        torch.manual_seed(3)
        self.down = RowParallelLinear(HIDDEN, DIM, input_is_parallel=True)
        torch.manual_seed(4)
        self.head = ColumnParallelLinear(DIM, VOCAB, bias=False, gather_output=False)

    def forward(self, ids, target):
        h = self.embed(ids)
        h = h + self.down(F.gelu(self.up(h)))
        return vocab_parallel_cross_entropy(self.head(h), target).mean()
