"""deepspeed.profiling.flops_profiler: FlopsProfiler and get_model_profile, DeepSpeed
0.19.8's per-module profile of one forward pass (parameters, MACs, FLOPs, latency),
counted by rules.py and printed in DeepSpeed's layout. Under an engine the profile
covers the forward of the global step profile_step on rank 0, and the engine's own
timers give the forward, backward and step latencies."""
import os
import sys
import time

import torch

from chorus.deepspeed.profiling.flops_profiler import rules
from chorus.deepspeed.profiling.flops_profiler.counts import (  # noqa: F401 (DeepSpeed's names here too)
    duration_to_string, flops_to_string, get_module_duration, get_module_flops, get_module_macs, macs_to_string,
    number_to_string, params_to_string)

_RNNS = (torch.nn.RNN, torch.nn.GRU, torch.nn.LSTM, torch.nn.RNNCell, torch.nn.LSTMCell, torch.nn.GRUCell)
_HOOKS = ("__flops_pre__", "__flops_post__", "__rnn_hook__", "__start_hook__", "__end_hook__")
_ATTRS = ("__flops__", "__macs__", "__params__", "__expert_params__", "__model_expert_params__", "__start_time__",
          "__duration__")


def _sync():
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _push(module, inputs):
    rules.flop_stack.append([])
    rules.mac_stack.append([])


def _pop(module, inputs, output):
    if rules.flop_stack:
        module.__flops__ += sum(f for _, f in rules.flop_stack.pop())
        module.__macs__ += sum(m for _, m in rules.mac_stack.pop())


def _start(module, inputs):
    _sync()
    module.__start_time__ = time.time()


def _end(module, inputs, output):
    _sync()
    module.__duration__ += time.time() - module.__start_time__


def _rnn(module, inputs, output):
    module.__flops__ += rules.rnn_flops(module, inputs)


class FlopsProfiler:
    def __init__(self, model, ds_engine=None, recompute_fwd_factor=0.0):
        self.model = model
        self.ds_engine = ds_engine
        self.recompute_fwd_factor = recompute_fwd_factor
        self.started = False
        self.func_patched = False

    def start_profile(self, ignore_list=None):
        self.reset_profile()
        rules.patch()
        ignore = tuple(ignore_list or ())

        def hook(module):
            if type(module) in ignore:
                return
            if type(module) in _RNNS:
                if not hasattr(module, "__rnn_hook__"):
                    module.__rnn_hook__ = module.register_forward_hook(_rnn)
                return
            for attr, register, fn in (("__flops_pre__", module.register_forward_pre_hook, _push),
                                       ("__flops_post__", module.register_forward_hook, _pop),
                                       ("__start_hook__", module.register_forward_pre_hook, _start),
                                       ("__end_hook__", module.register_forward_hook, _end)):
                if not hasattr(module, attr):
                    setattr(module, attr, register(fn))

        self.model.apply(hook)
        self.started = self.func_patched = True

    def stop_profile(self):
        if self.started and self.func_patched:
            rules.unpatch()
            self.func_patched = False

        def remove(module):
            for attr in _HOOKS:
                if hasattr(module, attr):
                    getattr(module, attr).remove()
                    delattr(module, attr)

        self.model.apply(remove)

    def reset_profile(self):
        def reset(module):
            module.__flops__ = module.__macs__ = 0
            module.__params__ = module.__expert_params__ = module.__model_expert_params__ = 0
            for p in module.parameters():
                group = getattr(p, "group_name", "")
                if isinstance(group, str) and group.startswith("ep_size_"):
                    try:
                        ep = int(group[len("ep_size_"):])
                    except ValueError:
                        ep = 0
                    if ep:
                        module.__expert_params__ += p.numel()
                        module.__model_expert_params__ += p.numel() * ep
                        continue
                module.__params__ += p.numel()
            module.__start_time__ = 0
            module.__duration__ = 0

        self.model.apply(reset)

    def end_profile(self):
        if not self.started:
            return
        self.stop_profile()
        self.started = False

        def clear(module):
            for attr in _ATTRS:
                if hasattr(module, attr):
                    delattr(module, attr)

        self.model.apply(clear)

    def get_total_flops(self, as_string=False):
        total = get_module_flops(self.model)
        return number_to_string(total) if as_string else total

    def get_total_macs(self, as_string=False):
        total = get_module_macs(self.model)
        return macs_to_string(total) if as_string else total

    def get_total_duration(self, as_string=False):
        total = get_module_duration(self.model)
        return duration_to_string(total) if as_string else total

    def get_total_params(self, as_string=False):
        total = self.model.__params__ + self.model.__expert_params__
        return params_to_string(total) if as_string else total

    def is_expert_tensor_parallelism_enabled(self):
        for module in self.model.modules():
            if hasattr(module, "enable_expert_tensor_parallelism"):
                return module.enable_expert_tensor_parallelism
        return False

    def print_model_profile(self, profile_step=1, module_depth=-1, top_modules=1, detailed=True, output_file=None):
        if not self.started:
            return
        from chorus.deepspeed.profiling.flops_profiler import report
        original, out = sys.stdout, None
        if output_file:
            folder = os.path.dirname(os.path.abspath(output_file))
            os.makedirs(folder, exist_ok=True)
            out = sys.stdout = open(output_file, "w")
        try:
            report.print_summary(self, profile_step)
            self.print_model_aggregated_profile(module_depth, top_modules)
            if detailed:
                report.print_detailed(self)
            print("-" * 78)
        finally:
            if out is not None:
                sys.stdout = original
                out.close()

    def print_model_aggregated_profile(self, module_depth=-1, top_modules=1):
        from chorus.deepspeed.profiling.flops_profiler import report
        if not hasattr(self.model, "__flops__"):
            print("no __flops__ attribute in the model, call this function after start_profile and before "
                  "end_profile")
            return
        report.print_aggregated(self, module_depth, top_modules)


def get_model_profile(model, input_shape=None, args=[], kwargs={}, print_profile=True, detailed=True,  # noqa: B006
                      module_depth=-1, top_modules=1, warm_up=1, as_string=True, output_file=None,
                      ignore_modules=None, mode="forward"):
    """(flops, macs, params) of one call of model, after warm_up unprofiled calls, as DeepSpeed's."""
    assert isinstance(model, torch.nn.Module), "model must be a PyTorch module"
    prof = FlopsProfiler(model)
    model.eval()
    if input_shape is not None:
        assert isinstance(input_shape, tuple) and len(input_shape) >= 1, "input_shape must be a non-empty tuple"
        first = next(model.parameters(), None)
        like = first if first is not None else torch.empty(0)
        args = [like.new_empty(input_shape)]
    assert args or kwargs, "give input_shape, args or kwargs"

    def call():
        fn = model.generate if mode == "generate" else model if mode == "forward" else None
        if fn is not None:
            return fn(*args, **kwargs) if kwargs else fn(*args)

    for _ in range(warm_up):
        call()
    prof.start_profile(ignore_list=ignore_modules)
    call()
    flops, macs, params = prof.get_total_flops(), prof.get_total_macs(), prof.get_total_params()
    if print_profile:
        prof.print_model_profile(profile_step=warm_up, module_depth=module_depth, top_modules=top_modules,
                                 detailed=detailed, output_file=output_file)
    prof.end_profile()
    if as_string:
        return number_to_string(flops), macs_to_string(macs), params_to_string(params)
    return flops, macs, params
