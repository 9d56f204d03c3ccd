"""ElasticSampler: shards a dataset over the current ranks and counts what this
epoch already processed, so that a reset re-shards only the rest.

As Horovod's: the epoch's order is one permutation (seeded by seed + epoch);
rank k takes every num_replicas-th index of what remains, so that when every
rank has processed b batches of size s, the processed samples are exactly the
first b * s * num_replicas of the order. processed_num counts them (record_batch
adds batch_size * num_replicas); a reset drops that prefix and re-shards the rest.
"""
import math
import random

import torch

from chorus.common.basics import rank, size


class ElasticSampler(torch.utils.data.Sampler):
    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.total_size = 0
        self.indices = []
        self.reset()

    def set_epoch(self, epoch):
        """A new epoch: nothing processed yet; the order depends on the epoch. Call it
        at the end of an epoch, so that a reset within one does not repeat samples."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """This rank processed another batch (as every rank did): processed_num grows
        by batch_size * the number of ranks."""
        self.processed_num += batch_size * self.num_replicas

    @property
    def processed_indices(self):
        """The samples this epoch has processed (the first processed_num of its order)."""
        return set(self._order()[:self.processed_num])

    def state_dict(self):
        return dict(epoch=self.epoch, processed_num=self.processed_num)

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def _order(self):
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        return order

    def reset(self):
        """Re-shards what this epoch has not processed over the current ranks."""
        self.num_replicas = size()
        self.rank = rank()
        self.remaining_indices = self._order()[self.processed_num:]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas
        self._shard()

    def _shard(self):
        indices = self.remaining_indices[:]
        indices += indices[:self.total_size - len(indices)]  # evenly divisible, as Horovod pads
        self.indices = indices[self.rank:self.total_size:self.num_replicas]

    def get_indices(self, batch_idx, batch_size):
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, len(self.indices))]

    def __iter__(self):
        self._shard()
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
