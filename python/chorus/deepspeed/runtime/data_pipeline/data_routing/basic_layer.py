"""RandomLayerTokenDrop: a layer that, while training and while the schedule keeps fewer
tokens than a sequence has, runs on a random reserved_length of them (the first wrapped
layer draws every layer's tokens for the step; encoder layers get the kept tokens'
attention mask, decoder layers its first square) and passes the others by."""
import torch

from chorus.deepspeed.ops.random_ltd import GatherTokens, ScatterTokens, bert_sample_tokens, gpt_sample_tokens


class RandomLayerTokenDrop(torch.nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.random_ltd_layer = layer
        self.random_ltd_scheduler = None
        self.max_length = None
        self.reserved_length = -1
        self.curr_seq = -1
        self.batch_first = False

    def init_config(self, config, scheduler, random_ltd_layer_id):
        self.random_ltd_scheduler = scheduler
        self.random_ltd_layer_id = random_ltd_layer_id
        self.max_length = scheduler.state["max_value"]
        self.mask_name = config.get("model_mask_name")
        self.micro_bs = config.get("micro_batch_size")
        self.random_ltd_num_layer = scheduler.random_ltd_layer_num
        order, self.model_type = config.get("hidden_state_order"), config.get("model_type")
        if order not in ("batch_seq_dim", "seq_batch_dim"):
            raise ValueError(f"DeepSpeed config: 'random_ltd.hidden_state_order' {order!r} is not batch_seq_dim "
                             "or seq_batch_dim")
        if self.model_type not in ("encoder", "decoder"):
            raise ValueError(f"DeepSpeed config: 'random_ltd.model_type' {self.model_type!r} is not encoder or "
                             "decoder")
        self.batch_first = order == "batch_seq_dim"
        self.index_generator = bert_sample_tokens if self.model_type == "encoder" else gpt_sample_tokens

    def forward(self, hidden_states, **kwargs):
        scheduler = self.random_ltd_scheduler
        if scheduler is not None:
            self.reserved_length = scheduler.get_current_seq()
            self.curr_seq, self.curr_micro_batch = (hidden_states.size(1), hidden_states.size(0)) \
                if self.batch_first else (hidden_states.size(0), hidden_states.size(1))
        if not (self.training and scheduler is not None and self.reserved_length < self.curr_seq):
            return self.random_ltd_layer(hidden_states, **kwargs)
        mask = kwargs[self.mask_name] if self.mask_name is not None else None
        if self.random_ltd_layer_id == 0:  # the step's draw, for every random-LTD layer
            indices, part_mask = self.index_generator(self.reserved_length, self.curr_seq, self.curr_micro_batch,
                                                      self.random_ltd_num_layer, hidden_states.device, mask)
            scheduler.state["sample_idx"], scheduler.state["attention_mask"] = indices, part_mask
        else:
            indices, part_mask = scheduler.state["sample_idx"], scheduler.state["attention_mask"]
        mine = indices[self.random_ltd_layer_id]
        hidden_states, kept = GatherTokens.apply(hidden_states, mine, self.batch_first)
        if self.mask_name is not None:
            kwargs[self.mask_name] = part_mask[self.random_ltd_layer_id] if self.model_type == "encoder" else part_mask
        outputs = self.random_ltd_layer(kept, **kwargs)
        if isinstance(outputs, tuple):
            return (ScatterTokens.apply(hidden_states, outputs[0], mine, self.batch_first),) + tuple(outputs[1:])
        if torch.is_tensor(outputs):
            return ScatterTokens.apply(hidden_states, outputs, mine, self.batch_first)
        raise TypeError(f"random-LTD: the wrapped layer returned {type(outputs).__name__}; a tensor or a tuple "
                        "whose first item is the hidden states is needed")
