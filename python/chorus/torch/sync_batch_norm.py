"""Batch normalization whose statistics span every rank of a process set."""
import torch
from torch.nn.modules.batchnorm import _BatchNorm

from chorus.common.process_sets import global_process_set
from chorus.torch.mpi_ops import Sum, allreduce


class SyncBatchNorm(_BatchNorm):
    """BatchNorm over the whole distributed batch (Horovod's hvd.SyncBatchNorm).

    In training the mean and variance are those of every rank's batch together;
    the allreduces are differentiable, so backward sums the statistics' gradients
    across ranks as torch's SyncBatchNorm does. Evaluation uses the running stats.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects at least 2D input (batch, channels, ...), got {input.dim()}D")

    def forward(self, input):
        self._check_input_dim(input)
        if not self.training or self.process_set.size() == 1:
            return super().forward(input)
        if self.track_running_stats:
            self.num_batches_tracked.add_(1)
        momentum = self.momentum
        if momentum is None:  # cumulative moving average
            momentum = 1.0 / float(self.num_batches_tracked)

        # Statistics in float32 at least, so half-precision batches keep their precision.
        x = input if input.dtype in (torch.float32, torch.float64) else input.float()
        dims = [0] + list(range(2, x.dim()))
        shape = [1, x.shape[1]] + [1] * (x.dim() - 2)
        count = torch.tensor([x.numel() // x.shape[1]], dtype=x.dtype, device=x.device)
        totals = allreduce(torch.cat([x.sum(dims), count]), op=Sum, process_set=self.process_set)
        n = totals[-1]
        if n.item() <= 1:
            raise ValueError("SyncBatchNorm needs more than one value per channel across the ranks' batches")
        mean = totals[:-1] / n
        centered = x - mean.view(shape)
        var = allreduce((centered * centered).sum(dims), op=Sum, process_set=self.process_set) / n
        out = centered * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)

        if self.track_running_stats:
            with torch.no_grad():
                unbiased = var * (n / (n - 1))
                self.running_mean.mul_(1 - momentum).add_(mean.to(self.running_mean.dtype), alpha=momentum)
                self.running_var.mul_(1 - momentum).add_(unbiased.to(self.running_var.dtype), alpha=momentum)
        return out.to(input.dtype)
