"""Dynamic batching (data_efficiency.data_sampling.dynamic_batching): DeepSpeed's
get_dataloader_and_lr_scheduler_for_variable_batch_size_deepspeed over a dataset of
sequences of 2-12 tokens, each picking order, then one pass of training with the
batch-size-scaled learning rate stepped at each optimizer step. Records, per case and
rank, the sample ids of every micro-batch, the learning rates and rank 0's losses.
Runs under whatever `import deepspeed` is; the test compares the real DeepSpeed 0.19.8
with chorus. FILES's cases take the lengths from the analyzer's files under METRICS_DIR: the first
measures them with batch_seqlens_fn and writes them, the second reads them back.

    dynamic_batching.py OUT.json METRICS_DIR CASE...
"""
import json
import sys

import torch

CASES = {"dataloader": {"sequence_picking_order": "dataloader", "lr_scaling_method": "linear"},
         "seqlen": {"sequence_picking_order": "seqlen", "lr_scaling_method": "sqrt", "max_batch_size": 5},
         "random": {"sequence_picking_order": "random", "lr_scaling_method": "linear", "min_batch_size": 2}}
# chorus only (DeepSpeed 0.19.8's DistributedDataAnalyzer, which measures them there, hangs on 2 CPU ranks):
# the lengths measured by batch_seqlens_fn into the metrics folder, then read from its files.
FILES = {"seqlen-measured": "seqlen", "seqlen-files": "seqlen"}


class Sequences(torch.utils.data.Dataset):
    def __init__(self):
        gen = torch.Generator().manual_seed(3)
        lengths = torch.randint(2, 13, (80,), generator=gen)
        self.items = [torch.randint(0, 50, (int(n),), generator=gen) for n in lengths]
        self.targets = torch.randn(80, 4, generator=gen)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return {"ids": self.items[i], "y": self.targets[i], "index": i}


def collate(samples):
    longest = max(len(s["ids"]) for s in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.long)
    mask = torch.zeros(len(samples), longest)
    for k, s in enumerate(samples):
        ids[k, :len(s["ids"])] = s["ids"]
        mask[k, :len(s["ids"])] = 1
    return {"ids": ids, "mask": mask, "y": torch.stack([s["y"] for s in samples]),
            "index": torch.tensor([[s["index"]] for s in samples])}  # (Megatron's: the analyzer reads it)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(50, 16)
        self.out = torch.nn.Linear(16, 4)

    def forward(self, ids, mask):
        h = (self.emb(ids) * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
        return self.out(h)


def run(case, metrics, rank):
    import deepspeed
    from deepspeed.runtime.data_pipeline.data_sampling.variable_batch_size_and_lr import \
        get_dataloader_and_lr_scheduler_for_variable_batch_size_deepspeed
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2, "steps_per_print": 10 ** 6,
           "data_efficiency": {"enabled": True, "seed": 7, "data_sampling": {
               "enabled": True, "num_workers": 0,
               "dynamic_batching": dict({"enabled": True, "max_tokens": 40, "metrics_path": metrics},
                                        **CASES[FILES.get(case, case)])}}}
    model = Model()
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2),
                                           config=cfg)
    data = Sequences()
    lengths = None if case in FILES else [len(s) for s in data.items]
    loader, scheduler, _ = get_dataloader_and_lr_scheduler_for_variable_batch_size_deepspeed(
        data, engine, dataset_seqlens=lengths, dataloader_collate_fn=collate,
        batch_seqlens_fn=lambda batch: batch["mask"].sum(1).long())
    out = {"ids": [], "lrs": [scheduler.get_lr()[0]], "losses": []}
    for batch in loader:
        out["ids"].append(batch["index"][:, 0].tolist())
        loss = torch.nn.functional.mse_loss(engine(batch["ids"], batch["mask"]), batch["y"])
        boundary = engine.is_gradient_accumulation_boundary()
        engine.backward(loss)
        engine.step()
        out["losses"].append(loss.item())
        if boundary:
            scheduler.step()
            out["lrs"].append(scheduler.get_lr()[0])
    return out


def main():
    import deepspeed
    deepspeed.init_distributed()
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    results = {}
    for case in sys.argv[3:]:
        try:
            results[case] = run(case, sys.argv[2], rank)
        except Exception as e:  # noqa: BLE001 - recorded, judged by the test
            results[case] = {"error": f"{type(e).__name__}: {e}"}
    every = [None] * world
    torch.distributed.all_gather_object(every, results)
    if rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump({"deepspeed": deepspeed.__file__, "ranks": every}, f)


if __name__ == "__main__":
    main()
