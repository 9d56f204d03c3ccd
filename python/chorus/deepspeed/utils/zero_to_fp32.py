"""deepspeed.utils.zero_to_fp32: a ZeRO checkpoint consolidated offline into fp32
weights, under DeepSpeed's function names (chorus-zero-to-fp32 is the command)."""
import os

import torch

from chorus.deepspeed.zero_to_fp32 import consolidate


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=None, exclude_frozen_parameters=False,
                                             lazy_mode=False):
    """{name: fp32 tensor} of a checkpoint folder (the one holding 'latest', or give tag)."""
    return consolidate(checkpoint_dir, tag)


def convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir, output_dir, max_shard_size="5GB",
                                               safe_serialization=False, tag=None,
                                               exclude_frozen_parameters=False):
    """Writes the consolidated fp32 weights into output_dir (pytorch_model.bin, or
    model.safetensors with safe_serialization); an output path ending in .bin or
    .pt is taken as the file itself, as older DeepSpeed did."""
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    if str(output_dir).endswith((".bin", ".pt", ".pth")):
        path = str(output_dir)
    else:
        os.makedirs(output_dir, exist_ok=True)
        path = os.path.join(output_dir, "model.safetensors" if safe_serialization else "pytorch_model.bin")
    tmp = f"{path}.tmp.{os.getpid()}"
    if safe_serialization:
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in state.items()}, tmp)
    else:
        torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def load_state_dict_from_zero_checkpoint(model, checkpoint_dir, tag=None):
    """Loads the consolidated fp32 weights into model (on the CPU) and returns it."""
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    model = model.cpu()
    model.load_state_dict(state, strict=False)
    return model
