"""deepspeed.moe.layer.MoE: a mixture-of-experts layer whose experts are spread
over an expert-parallel process set."""
import torch
import torch.nn.functional as F

import chorus.torch as hvd
from chorus.deepspeed.moe.experts import Experts
from chorus.deepspeed.moe.sharded_moe import MOELayer, TopKGate
from chorus.deepspeed.utils import groups


class MoE(torch.nn.Module):
    """DeepSpeed's MoE layer. forward(hidden_states, used_token=None) returns
    (output, l_aux, exp_counts). num_experts experts, num_experts/ep_size of them
    on each rank; tokens travel to their experts over the ep_size_<ep_size> set.
    use_residual: Residual MoE, a dense copy of expert mixed in by a learned coefficient."""

    def __init__(self, hidden_size, expert, num_experts=1, ep_size=1, k=1, capacity_factor=1.0,
                 eval_capacity_factor=1.0, min_capacity=4, use_residual=False, noisy_gate_policy=None,
                 drop_tokens=True, use_rts=True, use_tutel=False, enable_expert_tensor_parallelism=False,
                 top2_2nd_expert_sampling=True):
        super().__init__()
        if ep_size < 1 or num_experts % ep_size != 0:
            raise ValueError(f"MoE: num_experts ({num_experts}) must be divisible by ep_size ({ep_size})")
        world = hvd.size() if hvd.is_initialized() else 1
        if world % ep_size != 0:
            raise ValueError(f"MoE: ep_size ({ep_size}) must divide the world size ({world})")
        self.use_residual = use_residual
        self.enable_expert_tensor_parallelism = enable_expert_tensor_parallelism
        self.ep_size = ep_size
        self.expert_group_name = f"ep_size_{ep_size}"
        self.num_experts = num_experts
        self.num_local_experts = num_experts // ep_size
        experts = Experts(expert, self.num_local_experts, self.expert_group_name)
        self.deepspeed_moe = MOELayer(TopKGate(hidden_size, num_experts, k, capacity_factor, eval_capacity_factor,
                                               min_capacity, noisy_gate_policy, drop_tokens, use_rts, None,
                                               top2_2nd_expert_sampling),
                                      experts, self.expert_group_name, ep_size, self.num_local_experts,
                                      use_tutel=use_tutel)
        if use_residual:
            self.mlp = expert
            self.coefficient = torch.nn.Linear(hidden_size, 2)

    def set_deepspeed_parallelism(self, use_data_before_expert_parallel_=False):
        """Makes (or finds) this layer's expert-parallel sets; collective over every rank
        (deepspeed.initialize calls it, with the config's use_data_before_expert_parallel_;
        else the first forward does, with E + D)."""
        self._create_process_groups(use_data_before_expert_parallel_)

    def _create_process_groups(self, use_data_before_expert_parallel_=False):
        # Under an mpu the tokens are alike on a tensor-parallel group's ranks: the layer
        # splits them there (experts whole, the expert-parallel sets spanning the slices),
        # or, with enable_expert_tensor_parallelism, every slice holds a slice of each expert.
        sliced = groups.mpu is not None and self.enable_expert_tensor_parallelism and \
            groups.mpu.get_model_parallel_world_size() > 1
        if self.expert_group_name not in groups._get_expert_parallel_group_dict():
            if sliced:
                groups._create_expert_data_and_model_parallel(
                    self.ep_size, groups.mpu, use_data_before_expert_parallel_=use_data_before_expert_parallel_)
            else:
                groups._create_expert_and_data_parallel(
                    self.ep_size, use_data_before_expert_parallel_=use_data_before_expert_parallel_)
        elif groups._EXPERT_SLICED.get(self.expert_group_name, False) != sliced:
            raise ValueError(f"MoE: the {self.expert_group_name} sets exist already for "
                             f"{'tensor-parallel' if sliced is False else 'whole'} experts; layers of one ep_size "
                             "must agree on enable_expert_tensor_parallelism")
        elif groups._EXPERT_LAYOUT.get(self.expert_group_name) != bool(use_data_before_expert_parallel_):
            raise ValueError(f"MoE: the {self.expert_group_name} sets exist already with "
                             f"use_data_before_expert_parallel_={groups._EXPERT_LAYOUT[self.expert_group_name]}; "
                             f"asked for {bool(use_data_before_expert_parallel_)}")
        self.deepspeed_moe.expert_tp = sliced
        if self.deepspeed_moe.ep_group is None:
            self.deepspeed_moe._set_ep_group(groups._get_expert_parallel_group(self.expert_group_name))

    def forward(self, hidden_states, used_token=None):
        if (self.ep_size > 1 or groups.mpu is not None) and self.deepspeed_moe.ep_group is None:
            if not hvd.is_initialized():
                raise RuntimeError(f"MoE at ep_size {self.ep_size}: chorus is not initialized "
                                   "(deepspeed.init_distributed() first)")
            self.set_deepspeed_parallelism()  # every rank runs its first forward alike: collective
        output = self.deepspeed_moe(hidden_states, used_token)
        if self.use_residual:
            dense = self.mlp(hidden_states)
            if isinstance(dense, tuple):
                dense = dense[0]
            coef = F.softmax(self.coefficient(hidden_states), dim=-1)
            output = output * coef[..., 0:1] + dense * coef[..., 1:]
        return output, self.deepspeed_moe.l_aux, self.deepspeed_moe.exp_counts
