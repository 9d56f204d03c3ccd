"""deepspeed.accelerator.get_accelerator(): the device the program runs on, as
DeepSpeed's accelerator abstraction answers for it (CUDA when torch sees a GPU,
else the CPU)."""
import os

import torch


class _Accelerator:
    def __init__(self):
        self._name = "cuda" if torch.cuda.is_available() else "cpu"
        self._communication_backend_name = "nccl" if self._name == "cuda" else "gloo"

    # --- device ---
    def is_available(self):
        return True

    def device_name(self, device_index=None):
        if device_index is None or self._name == "cpu":
            return self._name
        return f"{self._name}:{device_index}"

    def device(self, device_index=None):
        return torch.device(self.device_name(device_index))

    def set_device(self, device_index):
        if self._name == "cuda":
            torch.cuda.set_device(device_index)

    def current_device(self):
        return torch.cuda.current_device() if self._name == "cuda" else 0

    def current_device_name(self):
        if self._name == "cuda":
            return f"cuda:{torch.cuda.current_device()}"
        return "cpu"

    def device_count(self):
        return torch.cuda.device_count() if self._name == "cuda" else 1

    def synchronize(self, device_index=None):
        if self._name == "cuda":
            torch.cuda.synchronize(device_index)

    def communication_backend_name(self):
        return self._communication_backend_name

    def is_synchronized_device(self):
        return self._name == "cpu"

    def use_host_timers(self):
        return self.is_synchronized_device()

    def resolves_data_dependency(self):
        return self.is_synchronized_device()

    def handles_memory_backpressure(self):
        return self.is_synchronized_device()

    # --- random ---
    def manual_seed(self, seed):
        torch.manual_seed(seed)

    def manual_seed_all(self, seed):
        torch.manual_seed(seed)
        if self._name == "cuda":
            torch.cuda.manual_seed_all(seed)

    def initial_seed(self):
        return torch.initial_seed()

    def get_rng_state(self, device_index=None):
        return torch.cuda.get_rng_state(device_index or 0) if self._name == "cuda" else torch.get_rng_state()

    def set_rng_state(self, new_state, device_index=None):
        if self._name == "cuda":
            torch.cuda.set_rng_state(new_state, device_index or 0)
        else:
            torch.set_rng_state(new_state)

    # --- memory ---
    def empty_cache(self):
        if self._name == "cuda":
            torch.cuda.empty_cache()

    def memory_allocated(self, device_index=None):
        return torch.cuda.memory_allocated(device_index) if self._name == "cuda" else 0

    def max_memory_allocated(self, device_index=None):
        return torch.cuda.max_memory_allocated(device_index) if self._name == "cuda" else 0

    def reset_peak_memory_stats(self, device_index=None):
        if self._name == "cuda":
            torch.cuda.reset_peak_memory_stats(device_index)

    def total_memory(self, device_index=None):
        if self._name == "cuda":
            return torch.cuda.get_device_properties(device_index or 0).total_memory
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def available_memory(self, device_index=None):
        if self._name == "cuda":
            free, _ = torch.cuda.mem_get_info(device_index)
            return free
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")

    # --- data types ---
    def is_bf16_supported(self):
        return torch.cuda.is_bf16_supported() if self._name == "cuda" else True

    def is_fp16_supported(self):
        return True

    def supported_dtypes(self):
        return [torch.float32, torch.float16, torch.bfloat16]

    # --- tensors ---
    def pin_memory(self, tensor, align_bytes=1):
        return tensor.pin_memory() if self._name == "cuda" else tensor

    def is_pinned(self, tensor):
        return tensor.is_pinned() if self._name == "cuda" else False

    def on_accelerator(self, tensor):
        return tensor.device.type == self._name

    def Stream(self, *args, **kwargs):  # noqa: N802 (DeepSpeed's name)
        return torch.cuda.Stream(*args, **kwargs) if self._name == "cuda" else None

    def stream(self, stream):
        import contextlib
        return torch.cuda.stream(stream) if self._name == "cuda" else contextlib.nullcontext()

    def current_stream(self, device_index=None):
        return torch.cuda.current_stream(device_index) if self._name == "cuda" else None

    def default_stream(self, device_index=None):
        return torch.cuda.default_stream(device_index) if self._name == "cuda" else None

    def Event(self, **kwargs):  # noqa: N802
        return torch.cuda.Event(**kwargs) if self._name == "cuda" else None

    def amp(self):
        return torch.cuda.amp if self._name == "cuda" else None

    def range_push(self, msg):
        pass

    def range_pop(self):
        pass

    def lazy_call(self, callback):
        return callback()

    def visible_devices_envs(self):
        return ["CUDA_VISIBLE_DEVICES"] if self._name == "cuda" else []


_accelerator = None


def get_accelerator():
    global _accelerator
    if _accelerator is None:
        _accelerator = _Accelerator()
    return _accelerator


def set_accelerator(accel):
    global _accelerator
    _accelerator = accel
