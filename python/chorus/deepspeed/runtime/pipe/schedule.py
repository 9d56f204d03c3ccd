"""DeepSpeed's pipeline schedules as lists of steps for one stage.

TrainSchedule is 1F1B: a stage first runs forward passes until the pipeline is
full (stages - stage - 1 of them), then alternates one forward and one backward,
and drains the rest of the backward passes; at most stages - stage micro-batches'
activations are alive at once. InferenceSchedule runs the forward passes only."""


def train_steps(micro_batches, stages, stage):
    """[("forward", i) | ("backward", i), ...] for micro-batches 0..micro_batches-1."""
    if not 0 <= stage < stages or micro_batches < 1:
        raise ValueError(f"train schedule: stage {stage} of {stages}, {micro_batches} micro-batches")
    warmup = min(stages - stage - 1, micro_batches)
    steps = [("forward", i) for i in range(warmup)]
    for i in range(micro_batches - warmup):
        steps.append(("forward", warmup + i))
        steps.append(("backward", i))
    steps.extend(("backward", i) for i in range(micro_batches - warmup, micro_batches))
    return steps


def inference_steps(micro_batches):
    return [("forward", i) for i in range(micro_batches)]


class TrainSchedule:
    def __init__(self, micro_batches, stages, stage_id):
        self.micro_batches, self.stages, self.stage_id = micro_batches, stages, stage_id

    def steps(self):
        return train_steps(self.micro_batches, self.stages, self.stage_id)

    def num_pipe_buffers(self):
        """Activations alive at once on this stage."""
        return max(1, min(self.stages - self.stage_id, self.micro_batches))


class InferenceSchedule:
    def __init__(self, micro_batches, stages, stage_id):
        self.micro_batches, self.stages, self.stage_id = micro_batches, stages, stage_id

    def steps(self):
        return inference_steps(self.micro_batches)

    def num_pipe_buffers(self):
        return 2
