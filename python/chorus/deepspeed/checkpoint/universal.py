"""DeepSpeed's universal checkpoint (what its ds_to_universal writes and `checkpoint.
load_universal` reads), read and written: TAG/zero/NAME/{fp32,exp_avg,exp_avg_sq}.pt, each
{"param": the whole fp32 tensor, "cat_dim": the dimension tensor-parallel slices split},
TAG/zero/NAME/step.pt (the step), TAG/zero/optimizer_state.pt (the optimizer's settings, the
loss scaler), TAG/mp_rank_00_model_states.pt (the module, counters, scheduler, client
state), and `latest_universal` beside TAG. Every parameter is whole, so an engine of any
data-parallel and tensor-parallel size and ZeRO stage takes its slice and its pieces."""
import glob
import os

import torch

from chorus.deepspeed.checkpoint import ds_pickle, ds_pickle_write as pw, ds_writer

LATEST = "latest_universal"
MODEL_STATES = "mp_rank_00_model_states.pt"
STAGE3_MODEL_STATES = "zero_pp_rank_0_mp_rank_00_model_states.pt"


def is_universal_checkpoint(path):
    return os.path.isfile(os.path.join(path, "zero", "optimizer_state.pt"))


def write(whole, values, path, cat_dims=None, save=pw.save):
    """A universal checkpoint of `whole` (ds_writer.Whole) into folder path: values[i] holds
    parameter i's whole fp32 value and state; cat_dims[name]: its tensor-parallel dimension."""
    keys = whole.state_keys
    cat_dims = cat_dims or {}
    zero = os.path.join(path, "zero")
    for i, name in enumerate(whole.names):
        folder = os.path.join(zero, name)
        os.makedirs(folder, exist_ok=True)
        for key, file in (("fp32", "fp32"),) + tuple((k, k) for k in keys):
            item = {"param": values[i][key].view(whole.shapes[i]).clone()}
            if cat_dims.get(name) is not None:
                item["cat_dim"] = int(cat_dims[name])
            save(item, os.path.join(folder, f"{file}.pt"))
        save(int(whole.step), os.path.join(folder, "step.pt"))
    groups = [ds_writer._param_group(whole.hypers[gi], [g]) for g, (gi, _) in enumerate(whole.groups())]
    save({"loss_scaler": ds_writer._scaler(whole), "dynamic_loss_scale": bool((whole.scaler or {}).get("dynamic")),
          "overflow": False, "clip_grad": whole.clip_grad, "zero_stage": pw.zero_stage(2),
          "partition_count": [1] * len(groups), "ds_version": ds_writer.DS_VERSION, "param_groups": groups,
          # (what DeepSpeed's ZeRO-3 reads: the step and settings as its optimizer's state_dict has them)
          "optimizer_state_dict": {"state": {0: {"step": int(whole.step)}}, "param_groups": groups}},
         os.path.join(zero, "optimizer_state.pt"))
    module = {whole.names[i]: values[i]["fp32"].view(whole.shapes[i]).to(whole.dtype) for i in range(len(whole.names))}
    states = ds_writer._model_states(whole, 2, 1, module)
    save(states, os.path.join(path, MODEL_STATES))
    save(states, os.path.join(path, STAGE3_MODEL_STATES))  # (the name DeepSpeed's ZeRO-3 looks for)


class UniversalCheckpoint:
    """names (the parameters it holds), shape(name), read(name) -> {"fp32", state keys...},
    step, param_groups, scaler, model_states; all through chorus's unpickler."""

    def __init__(self, path):
        self.path = path
        zero = os.path.join(path, "zero")
        self.optimizer_state = ds_pickle.load(os.path.join(zero, "optimizer_state.pt"))
        files = sorted(glob.glob(os.path.join(glob.escape(path), "*model_states.pt")))
        if not files:
            raise ValueError(f"load_checkpoint: the universal checkpoint {path} has no model states file")
        self.model_states = ds_pickle.load(os.path.join(path, MODEL_STATES) if os.path.isfile(
            os.path.join(path, MODEL_STATES)) else files[0])
        self.param_groups = self.optimizer_state.get("param_groups") or []
        record = self.optimizer_state.get("loss_scaler")
        state = getattr(record, "state", None)
        self.scaler = dict(state) if isinstance(state, dict) and state.get("dynamic") else None
        self.zero = zero

    def has(self, name):
        return os.path.isfile(os.path.join(self.zero, name, "fp32.pt"))

    def read(self, name, keys):
        folder = os.path.join(self.zero, name)
        out, cat_dim = {}, None
        for key in ("fp32",) + tuple(keys):
            f = os.path.join(folder, f"{key}.pt")
            if not os.path.isfile(f):
                raise ValueError(f"load_checkpoint: the universal checkpoint has no {key}.pt for '{name}' (in "
                                 f"{folder}); saved by another optimizer?")
            item = ds_pickle.load(f)
            if torch.is_tensor(item):  # (ds_to_universal's ZeRO-3 output: the flat tensor alone)
                item = {"param": item}
            if not isinstance(item, dict) or not torch.is_tensor(item.get("param")):
                raise ValueError(f"load_checkpoint: {f} holds no tensor under 'param'")
            out[key] = item["param"].detach().float()
            cat_dim = item.get("cat_dim", cat_dim)
        return out, cat_dim

    def step(self, name):
        f = os.path.join(self.zero, name, "step.pt")
        if os.path.isfile(f):
            step = ds_pickle.load(f)
        else:  # (ds_to_universal's ZeRO-3 output keeps it in the optimizer's state)
            state = (self.optimizer_state.get("optimizer_state_dict") or {}).get("state") or {}
            step = state[min(state)].get("step") if state else None
            if step is None:
                return None
        return int(step.item() if torch.is_tensor(step) else step)
