"""ElasticSampler: shards a dataset over the current ranks and remembers what
this epoch already processed, so that a reset re-shards only the rest."""
import math

import torch

from chorus.common.basics import rank, size


class ElasticSampler(torch.utils.data.Sampler):
    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices = set()
        self.processed_num = 0  # samples the ranks processed this epoch (Horovod's count)
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.total_size = 0
        self.indices = []
        self.reset()

    def set_epoch(self, epoch):
        """A new epoch: nothing processed yet; the shuffle depends on the epoch."""
        self.epoch = epoch
        self.processed_indices = set()
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Marks the batch_idx-th batch of this rank's shard as processed (every rank
        processes one: processed_num grows by batch_size * the number of ranks)."""
        self.record_indices(self.get_indices(batch_idx, batch_size))
        self.processed_num += batch_size * self.num_replicas

    def record_indices(self, indices):
        self.processed_indices.update(indices)

    def get_indices(self, batch_idx, batch_size):
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, len(self.indices))]

    def state_dict(self):
        return dict(epoch=self.epoch, processed_indices=set(self.processed_indices), processed_num=self.processed_num)

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_indices = set(state_dict["processed_indices"])
        self.processed_num = state_dict.get("processed_num", len(self.processed_indices))
        self.reset()

    def reset(self):
        """Re-shards what this epoch has not processed over the current ranks."""
        self.num_replicas = size()
        self.rank = rank()
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(self.dataset), generator=g).tolist()
        else:
            order = list(range(len(self.dataset)))
        self.remaining_indices = [i for i in order if i not in self.processed_indices]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas
        self._shard()

    def _shard(self):
        indices = self.remaining_indices[:]
        indices += indices[:self.total_size - len(indices)]  # evenly divisible, as Horovod pads
        self.indices = indices[self.rank:self.total_size:self.num_replicas]

    def __iter__(self):
        self._shard()
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
