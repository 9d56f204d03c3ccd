"""Random-LTD's schedule (data_efficiency.data_routing.random_ltd): how many tokens of
each sequence the random-LTD layers keep at a global step. fixed_linear grows it from
min_value to max_value over require_steps, in multiples of seq_per_step, as DeepSpeed's;
the layer tokens consumed so far are counted for the layer-token LR schedule."""


class RandomLTDScheduler:
    def __init__(self, config):
        self.model_layer_num = config["total_layer_num"]
        self.random_ltd_layer_num = config["random_ltd_layer_num"]
        self.config_schedule = config["random_ltd_schedule"]
        self.global_batch_size = config["global_batch_size"]
        if (config.get("layer_token_lr_schedule") or {}).get("enabled"):
            raise ValueError("DeepSpeed config: 'data_efficiency.data_routing.random_ltd.layer_token_lr_schedule' "
                             "is switched on; DeepSpeed 0.19.8 has no such schedule either")
        if self.config_schedule["schedule_type"] != "fixed_linear":
            raise ValueError("DeepSpeed config: 'random_ltd_schedule.schedule_type' "
                             f"{self.config_schedule['schedule_type']!r}: only fixed_linear exists")
        self.state = {}
        self.reset_to_init()

    def reset_to_init(self):
        s = self.config_schedule
        self.state.update(min_value=s["min_value"], max_value=s["max_value"], current_value=s["min_value"],
                          schedule_config=s["schedule_config"], schedule_type=s["schedule_type"],
                          consumed_layer_tokens=0, current_steps=-1)

    def get_value(self, global_steps):
        cfg, lo, hi = self.state["schedule_config"], self.state["min_value"], self.state["max_value"]
        value = int((float(global_steps) / cfg["require_steps"]) * (hi - lo) + lo)  # (floor: both non-negative)
        value -= value % cfg["seq_per_step"]
        return min(value, hi)

    def get_current_seq(self):
        return self.state["current_value"]

    def set_current_seq(self, seq_length):
        self.state["current_value"] = seq_length

    def get_random_ltd_layer_num(self):
        return self.random_ltd_layer_num

    def get_state(self):
        return self.state

    def set_state(self, state):
        self.state = state

    def update_seq(self, global_steps):
        if self.state["current_value"] < self.state["max_value"]:
            self.state["current_value"] = self.get_value(global_steps)
        if global_steps != self.state["current_steps"]:
            dropped = self.state["current_value"] * self.random_ltd_layer_num
            whole = self.state["max_value"] * (self.model_layer_num - self.random_ltd_layer_num)
            self.state["consumed_layer_tokens"] += self.global_batch_size * (dropped + whole)
            self.state["current_steps"] = global_steps

    def get_total_layer_tokens(self, train_iters):
        for step in range(train_iters):
            self.update_seq(step)
        return self.state["consumed_layer_tokens"]

    def state_dict(self):
        return {k: self.state[k] for k in ("consumed_layer_tokens", "current_steps", "current_value", "min_value",
                                           "max_value")}

    def load_state_dict(self, state_dict):
        self.state.update({k: state_dict[k] for k in ("consumed_layer_tokens", "current_steps", "current_value",
                                                      "min_value", "max_value")})
