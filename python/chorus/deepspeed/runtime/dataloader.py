"""deepspeed.runtime.dataloader: RepeatingLoader, and the loader deepspeed_io returns under
curriculum learning (each rank's micro-batches as the curriculum sampler draws them,
passed through the engine's data post-process function with the sampler's state)."""
import torch


class RepeatingLoader:
    """Iterates over loader for ever, starting it again at each end."""

    def __init__(self, loader):
        self.loader = loader
        self.data_iter = iter(loader)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.data_iter)
        except StopIteration:
            self.data_iter = iter(self.loader)
            return next(self.data_iter)


class CurriculumDataLoader:
    def __init__(self, dataset, sampler, collate_fn=None, num_workers=0, pin_memory=False):
        self.dataset, self.data_sampler, self.collate_fn = dataset, sampler, collate_fn
        self.num_local_io_workers, self.pin_memory = num_workers, pin_memory
        self.post_process_func = None
        self.batch_size = sampler.micro_batch_size
        self.curriculum_learning_enabled = True
        self.len = len(sampler) // self.batch_size
        self._iter = None

    def __len__(self):
        return self.len

    def __iter__(self):
        kwargs = {"collate_fn": self.collate_fn} if self.collate_fn is not None else {}
        self.dataloader = torch.utils.data.DataLoader(self.dataset, batch_sampler=self.data_sampler,
                                                      num_workers=self.num_local_io_workers,
                                                      pin_memory=self.pin_memory, **kwargs)
        self._iter = iter(self.dataloader)
        return self

    def __next__(self):
        if self._iter is None:
            iter(self)
        data = next(self._iter)
        if self.post_process_func is not None:
            data = self.post_process_func(data, self.data_sampler.state_dict())
        return data
