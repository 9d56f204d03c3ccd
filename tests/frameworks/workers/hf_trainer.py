"""Transformers' Trainer with a DeepSpeed config, `import deepspeed` resolving to
chorus.deepspeed (the alias). A tiny GPT-2 from a config, random weights, random
token data, CPU. Prints every step's loss; rank 0 writes the starting weights (for
the reference) and, with --resume, continues from the checkpoint at step 10.

    hf_trainer.py MODE OUT [--resume] [--reference [--init FILE]]
MODE: z2 | z3 | z2_offload | z3_offload. --reference: one plain torch process on the
global batch, no DeepSpeed (--init: starting from FILE's weights). Every run builds its model from the same seed and writes
the weights it starts from to OUT/init.pt (gathered under ZeRO-3), so that a test can
check that DeepSpeed, chorus and the plain process start alike. The same script runs
under the real DeepSpeed (started by torchrun) and under chorus.
"""
import argparse
import json
import os

import torch
import transformers
from transformers import GPT2Config, AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments

MICRO, RANKS, STEPS, SAVE = 2, 2, 20, 10
ZERO = {
    "z2": {"stage": 2},
    "z3": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True},
    "z2_offload": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
    "z3_offload": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}},
}


def ds_config(mode, ds_layout=False):
    # As people write them for the Trainer: "auto" where the Trainer fills the value in. No
    # scheduler section: the Trainer's own (linear warmup and decay) steps the ZeRO optimizer.
    # ds_layout: checkpoints in DeepSpeed's own layout (chorus's checkpoint.format; DeepSpeed ignores it).
    return {**({"checkpoint": {"format": "deepspeed"}} if ds_layout else {}),"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
            "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                      "weight_decay": "auto"}},
            "zero_optimization": ZERO[mode], "steps_per_print": float("inf"), "wall_clock_breakdown": False}


class Data(torch.utils.data.Dataset):
    def __init__(self, n=MICRO * RANKS * STEPS, length=12, vocab=48):
        g = torch.Generator().manual_seed(7)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class PrintLoss(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs and state.is_world_process_zero:
            print(f"step {state.global_step} loss {logs['loss']:.6f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode")
    ap.add_argument("out")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--ds-layout", action="store_true", help="save checkpoints in DeepSpeed's layout")
    ap.add_argument("--reference", action="store_true")
    ap.add_argument("--init")
    ap.add_argument("--init-only", action="store_true", help="write init.pt and stop")
    a = ap.parse_args()
    common = dict(output_dir=a.out, max_steps=STEPS, learning_rate=5e-3, warmup_steps=3, weight_decay=0.0,
                  max_grad_norm=1.0, logging_steps=1, save_steps=SAVE, save_strategy="steps", report_to=[],
                  seed=0, data_seed=0, dataloader_drop_last=True, lr_scheduler_type="linear",
                  disable_tqdm=True, save_only_model=False)
    if a.reference:
        args = TrainingArguments(per_device_train_batch_size=MICRO * RANKS, **dict(common, save_strategy="no"))
    else:
        # Without a GPU, Accelerate gives DeepSpeed no torch.distributed backend
        # (with DeepSpeed itself too): a state configured with gloo is its way round.
        os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
        from accelerate import PartialState
        PartialState(backend="gloo")
        args = TrainingArguments(per_device_train_batch_size=MICRO, deepspeed=ds_config(a.mode, a.ds_layout),
                                 accelerator_config={"use_configured_state": True}, **common)
    transformers.set_seed(0)
    config = GPT2Config(vocab_size=48, n_positions=16, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0)
    model = AutoModelForCausalLM.from_config(config)  # under ZeRO-3: built inside deepspeed.zero.Init
    if a.reference:
        if a.init:
            model.load_state_dict(torch.load(a.init))
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    elif not a.resume:
        import deepspeed
        params = list(model.parameters())
        if ZERO[a.mode]["stage"] == 3:  # built under zero.Init: only placeholders here
            assert all(hasattr(p, "ds_id") and p.numel() == 0 for p in params), "zero.Init did not partition"
            print(f"zero.Init partitioned {len(params)} parameters", flush=True)
        with deepspeed.zero.GatheredParameters(params):
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if not a.resume and args.process_index == 0:
        os.makedirs(a.out, exist_ok=True)
        torch.save(state, os.path.join(a.out, "init.pt"))
    if a.init_only:
        # Real DeepSpeed's comm threads can abort the interpreter's exit
        # ("terminate called without an active exception") unless the group is closed.
        if torch.distributed.is_initialized():
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()
        return
    trainer = Trainer(model=model, args=args, train_dataset=Data(), callbacks=[PrintLoss()])
    if a.resume:
        trainer.train(resume_from_checkpoint=os.path.join(a.out, f"checkpoint-{SAVE}"))
    else:
        trainer.train()
    if a.reference:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, os.path.join(a.out, "final.pt"))
    if args.process_index == 0:
        print("trained", json.dumps({"steps": trainer.state.global_step}), flush=True)


if __name__ == "__main__":
    main()
