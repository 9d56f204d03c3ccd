"""The engine's random-LTD (data_efficiency.data_routing.random_ltd), as DeepSpeed's: a
schedule made from the config (its batch sizes filled in from the engine's), advanced at
each training forward, wired to the RandomLayerTokenDrop layers by random_ltd_initialize
(convert_to_random_ltd calls it), and kept in checkpoints."""
from collections import deque


class EngineRandomLTD:
    def _random_ltd_init(self):
        section = ((self._raw_config.get("data_efficiency") or {}).get("data_routing") or {}).get("random_ltd") or {}
        self._random_ltd = dict(section) if section.get("enabled") else None
        self.random_ltd_scheduler = None
        if self._random_ltd is not None:
            from chorus.deepspeed.runtime.data_pipeline.data_routing import RandomLTDScheduler
            self._random_ltd["global_batch_size"] = self.train_batch_size()
            self._random_ltd["micro_batch_size"] = self.train_micro_batch_size_per_gpu()
            self.random_ltd_scheduler = RandomLTDScheduler(self._random_ltd)

    def random_ltd_enabled(self):
        return self._random_ltd is not None

    def random_ltd_config(self):
        return self._random_ltd

    def random_ltd_initialize(self):
        """Each RandomLayerTokenDrop layer whose name holds the next of random_ltd_layer_id
        (in order) gets the schedule and its number among them."""
        from chorus.deepspeed.runtime.data_pipeline.data_routing import RandomLayerTokenDrop
        if not self.random_ltd_enabled():
            raise ValueError("random_ltd_initialize: the config does not enable "
                             "'data_efficiency.data_routing.random_ltd'")
        queue = deque(sorted(self._random_ltd["random_ltd_layer_id"]))
        count = 0
        for name, layer in self.module.named_modules():
            if isinstance(layer, RandomLayerTokenDrop) and queue and str(queue[0]) in name:
                layer.init_config(self._random_ltd, self.random_ltd_scheduler, count)
                queue.popleft()
                count += 1
        if self._random_ltd["random_ltd_layer_num"] != count:
            raise ValueError(f"random_ltd_layer_num {self._random_ltd['random_ltd_layer_num']} must equal the number "
                             f"of random-LTD layers random_ltd_layer_id names, {count}")

    def _random_ltd_forward(self):
        if self.random_ltd_scheduler is not None and self.module.training:
            self.random_ltd_scheduler.update_seq(self.global_steps)
