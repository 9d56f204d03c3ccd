"""Curriculum learning end to end, under whatever `import deepspeed` is (the real DeepSpeed
under torchrun, or chorus under chorusrun), on 2 ranks:
1. DataAnalyzer, one map worker per rank: a per-sample difficulty (single_value_per_sample)
   and the label counts (accumulate_value_over_samples) into FOLDER/analysis;
2. training with data_efficiency.data_sampling.curriculum_learning over those index files:
   by value with a fixed_linear schedule, and by percentile with a fixed_discrete one;
   each rank records the sample indices of its micro-batches and the losses.
Under chorus, also: a run checkpointed halfway and resumed draws the same samples.

    curriculum.py FOLDER      (writes FOLDER/result_RANK.json)
"""
import json
import sys

import numpy as np
import torch

import deepspeed
from deepspeed import comm as dist
from deepspeed.runtime.data_pipeline.data_sampling.data_analyzer import DataAnalyzer

N, STEPS = 400, 12
DIFFICULTY = np.array([(i * 5) % 8 + 1 for i in range(N)], dtype=np.int64)


class Data(torch.utils.data.Dataset):
    def __init__(self):
        gen = torch.Generator().manual_seed(7)
        self.x, self.y = torch.randn(N, 8, generator=gen), torch.randint(0, 3, (N,), generator=gen)

    def __len__(self):
        return N

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


def analyze(folder, rank):
    labels = lambda batch: np.bincount(batch[1].numpy(), minlength=3).astype(np.int64)  # noqa: E731
    DataAnalyzer(Data(), num_workers=2, worker_id=rank, batch_size=16, metric_names=["difficulty", "labels"],
                 metric_functions=[lambda batch: DIFFICULTY[batch[2].numpy()], labels],
                 metric_types=["single_value_per_sample", "accumulate_value_over_samples"],
                 metric_dtypes=[np.int64, np.int64], save_path=f"{folder}/analysis").run_map_reduce()


def config(folder, case, tag):
    index = f"{folder}/analysis/difficulty/difficulty"
    if case == "value":
        metric = {"index_to_sample_path": f"{index}_index_to_sample", "index_to_metric_path": f"{index}_index_to_metric",
                  "difficulty_type": "value", "clustering_type": "schedule_based", "min_difficulty": 1,
                  "max_difficulty": 8, "schedule_type": "fixed_linear",
                  "schedule_config": {"total_curriculum_step": 8, "difficulty_step": 1}}
    else:
        metric = {"index_to_sample_path": f"{index}_index_to_sample_percentile_merged",
                  "difficulty_type": "percentile", "clustering_type": "schedule_based", "min_difficulty": 20,
                  "max_difficulty": 100, "schedule_type": "fixed_discrete",
                  "schedule_config": {"difficulty": [20, 60, 100], "max_step": [3, 6]}}
    return {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 10 ** 6, "gradient_clipping": 1.0,
            "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
            "data_efficiency": {"enabled": True, "seed": 1234, "data_sampling": {
                "enabled": True, "num_workers": 0, "curriculum_learning": {
                    "enabled": True, "data_cluster_path": f"{folder}/clusters_{tag}",
                    "curriculum_metrics": {"difficulty": metric}}}}}


def train(cfg, steps, checkpoint=None, load=None):
    torch.manual_seed(0)
    engine, _, loader, _ = deepspeed.initialize(model=torch.nn.Linear(8, 3), config=cfg, training_data=Data())
    if load:
        engine.load_checkpoint(load)
    seen, losses = [], []
    it = iter(loader)
    for step in range(steps):
        x, y, index = next(it)
        loss = torch.nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
        seen.append(index.tolist())
        losses.append(loss.item())
        if checkpoint and step == steps // 2 - 1:
            engine.save_checkpoint(checkpoint, tag="half")
    return seen, losses


def main():
    folder = sys.argv[1]
    deepspeed.init_distributed()
    rank = dist.get_rank()
    analyze(folder, rank)
    result = {"deepspeed": deepspeed.__file__}
    for case in ("value", "percentile"):
        seen, losses = train(config(folder, case, case), STEPS)
        dist.barrier()
        result[case] = {"seen": seen, "losses": losses}
    if "chorus" in deepspeed.__file__:  # (DeepSpeed's sampler state saves numpy's global stream, not its own)
        cfg = config(folder, "value", "resume")
        whole, _ = train(cfg, STEPS, checkpoint=f"{folder}/ckpt")
        dist.barrier()
        resumed, _ = train(cfg, STEPS // 2, load=f"{folder}/ckpt")
        result["resumed_equal"] = resumed == whole[STEPS // 2:]
    with open(f"{folder}/result_{rank}.json", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
