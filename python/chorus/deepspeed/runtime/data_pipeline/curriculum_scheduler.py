"""A curriculum metric's difficulty at a step, as DeepSpeed 0.19.8's CurriculumScheduler
gives it: fixed_discrete (a difficulty per range of steps), fixed_linear and fixed_root
(from min_difficulty to max_difficulty over total_curriculum_step, floored to a multiple
of difficulty_step and never below the first such multiple at or above min_difficulty),
or custom (a function of the step the user sets)."""
import math
import warnings

SCHEDULES = ("fixed_discrete", "fixed_linear", "fixed_root", "custom")


def _need(cfg, key, where):
    if key not in cfg:
        raise ValueError(f"DeepSpeed config: curriculum learning needs '{where}{key}'")
    return cfg[key]


class CurriculumScheduler:
    def __init__(self, config):
        lo = _need(config, "min_difficulty", "")
        hi = _need(config, "max_difficulty", "")
        kind = _need(config, "schedule_type", "")
        if kind not in SCHEDULES:
            raise ValueError(f"DeepSpeed config: curriculum 'schedule_type' {kind!r} is not one of {list(SCHEDULES)}")
        self.state = {"min_difficulty": lo, "max_difficulty": hi, "current_difficulty": lo, "schedule_type": kind}
        self.custom_get_difficulty = None
        if kind == "custom":
            return
        sc = _need(config, "schedule_config", "")
        if kind == "fixed_discrete":
            difficulty, max_step = _need(sc, "difficulty", "schedule_config."), _need(sc, "max_step", "schedule_config.")
            if not max_step or len(difficulty) != len(max_step) + 1:
                raise ValueError("DeepSpeed config: fixed_discrete's schedule_config needs one more 'difficulty' than "
                                 f"'max_step' (got {len(difficulty)} and {len(max_step)})")
        else:
            _need(sc, "total_curriculum_step", "schedule_config.")
            if _need(sc, "difficulty_step", "schedule_config.") % 8:
                warnings.warn("curriculum: difficulty_step is not a multiple of 8 (which a seqlen metric wants for "
                              "tensor cores); disregard this for other metrics")
            if kind == "fixed_root":
                _need(sc, "root_degree", "schedule_config.")
        self.state["schedule_config"] = sc

    def set_custom_get_difficulty(self, schedule_function):
        self.custom_get_difficulty = schedule_function

    def get_current_difficulty(self):
        return self.state["current_difficulty"]

    def set_current_difficulty(self, difficulty):
        self.state["current_difficulty"] = difficulty

    def get_state(self):
        return self.state

    def set_state(self, state):
        self.state = state

    def _root(self, step, degree):
        sc, lo, hi = self.state["schedule_config"], self.state["min_difficulty"], self.state["max_difficulty"]
        d = math.floor((float(step) / sc["total_curriculum_step"]) ** (1.0 / degree) * (hi - lo) + lo)
        unit = sc["difficulty_step"]
        d -= d % unit
        return min(max(d, -(-lo // unit) * unit), hi)

    def get_difficulty(self, global_steps):
        kind = self.state["schedule_type"]
        if kind == "fixed_discrete":
            sc = self.state["schedule_config"]
            for difficulty, last in zip(sc["difficulty"], sc["max_step"]):
                if global_steps <= last:
                    return difficulty
            return sc["difficulty"][-1]
        if kind == "fixed_linear":
            return self._root(global_steps, 1)
        if kind == "fixed_root":
            return self._root(global_steps, self.state["schedule_config"]["root_degree"])
        if self.custom_get_difficulty is None:
            raise ValueError("curriculum: schedule_type custom needs engine.set_custom_curriculum_learning_schedule "
                             "before training")
        return self.custom_get_difficulty(global_steps)

    def update_difficulty(self, global_steps):
        if self.state["current_difficulty"] < self.state["max_difficulty"]:
            self.state["current_difficulty"] = self.get_difficulty(global_steps)
        return self.state["current_difficulty"]
