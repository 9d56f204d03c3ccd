"""The engine's curriculum learning (data_efficiency.data_sampling.curriculum_learning),
as DeepSpeed's: deepspeed_io (and initialize's training_data) returns a loader whose
sampler draws each global batch by the metrics' difficulties; the sampler's state goes
into checkpoints; set_data_post_process_func and set_custom_curriculum_learning_schedule
reach it."""


class EngineCurriculum:
    def _sampling(self):
        return (self._raw_config.get("data_efficiency") or {}).get("data_sampling") or {}

    def data_sampling_enabled(self):
        return bool(self._sampling().get("enabled", False))

    def data_sampling_config(self):
        return self._sampling()

    def curriculum_learning_enabled(self):
        return bool((self._sampling().get("curriculum_learning") or {}).get("enabled", False))

    def curriculum_learning_config(self):
        return self._sampling().get("curriculum_learning") or {}

    def _curriculum_io(self, dataset, batch_size, collate_fn, replicas, index):
        from chorus.deepspeed.runtime.data_pipeline.data_sampling.data_sampler import DeepSpeedDataSampler
        from chorus.deepspeed.runtime.dataloader import CurriculumDataLoader
        sampler = DeepSpeedDataSampler(self._raw_config.get("data_efficiency") or {}, len(dataset),
                                       batch_size or self.train_micro_batch_size_per_gpu(), index, replicas,
                                       self._data_set(), self.gradient_accumulation_steps(), self.global_rank,
                                       drop_last=bool(self._raw_config.get("dataloader_drop_last", False)))
        return CurriculumDataLoader(dataset, sampler, collate_fn, num_workers=self._sampling().get("num_workers", 0),
                                    pin_memory=bool(self._sampling().get("pin_memory", False)))

    def _data_set(self):
        """The process set of the ranks that read different samples."""
        if self._sp == 1:
            return self.process_set
        from chorus.deepspeed.utils import groups as ds_groups
        return ds_groups._get_data_parallel_group()

    def _curriculum_sampler(self):
        loader = self.training_dataloader
        return loader.data_sampler if self.curriculum_learning_enabled() and hasattr(loader, "data_sampler") \
            else None

    def set_data_post_process_func(self, post_process_func):
        if self.training_dataloader is not None:
            self.training_dataloader.post_process_func = post_process_func

    def set_custom_curriculum_learning_schedule(self, schedule_func_dict):
        sampler = self._curriculum_sampler()
        if sampler is not None:
            sampler.set_custom_curriculum_learning_schedule(schedule_func_dict)
