"""The state of a torch optimizer the ZeRO engine runs as given (over fp32 views of its
partition): each rank writes it beside its shard and reads it back at the same layout.
chorus's own kernels' states reshard across sizes and stages; such a state cannot, so
a load at another layout is refused by name."""
import json
import os

import numpy as np
import torch

from chorus import _core


def _name(rank, mp):
    return f"zero_rank_{rank:05d}{'' if mp is None else f'_mp_rank_{mp:02d}'}_client_optim_states.chorus"


def _client(engine):
    from chorus.deepspeed.runtime.partition_optimizers import _PartitionOptimizer
    client = engine._client
    if client is None or (isinstance(client, _PartitionOptimizer) and not getattr(client, "own_state", False)):
        return None  # (moments: the engine's)
    return client


def _layout(engine):
    cores = [engine.core] + [part.core for part in engine._expert_parts]
    return {"world": engine.process_set.size(), "stage": engine.core.stage,
            "partitions": [int(core.partition_elems) for core in cores]}


def save(engine, path, identity, sink):
    client = _client(engine)
    if client is None:
        return
    sd = client.state_dict()
    blobs, state = {}, {}
    for index, entry in sd["state"].items():  # tensors as raw bytes, the rest as JSON: nothing to unpickle
        state[str(index)] = {}
        for key, value in entry.items():
            if torch.is_tensor(value):
                blobs[f"{index}:{key}"] = value.detach().cpu().contiguous().numpy().tobytes()
                value = {"tensor": str(value.dtype).replace("torch.", ""), "shape": list(value.shape)}
            state[str(index)][key] = value
    meta = {"save": identity, "layout": _layout(engine), "type": type(client).__name__, "state": state,
            "param_groups": sd["param_groups"]}
    sink.file(os.path.join(path, _name(engine.process_set.rank(), engine._mp_rank)), json.dumps(meta), blobs)


def read(engine, path, identity):
    """This rank's saved state, checked (None when the engine runs chorus's own kernels)."""
    client = _client(engine)
    file = os.path.join(path, _name(engine.process_set.rank(), engine._mp_rank))
    if client is None:
        if os.path.exists(file):
            raise ValueError(f"load_checkpoint: {file} holds the state of a torch optimizer the engine ran as "
                             "given; this engine runs chorus's own kernels instead, which would start without it")
        return None
    kind = type(client).__name__
    if not os.path.exists(file):
        raise ValueError(f"load_checkpoint: {file} is missing: the checkpoint holds no state of the {kind} "
                         "this engine runs")
    meta, blobs = _core.read_checkpoint_file(file)
    meta = json.loads(meta)
    if identity and meta.get("save") != identity:
        raise ValueError(f"load_checkpoint: {file} belongs to another save than the rest of the checkpoint")
    if meta.get("type") != kind or meta.get("layout") != _layout(engine):
        raise ValueError(f"load_checkpoint: {file} holds a {meta.get('type')} state over a partition of "
                         f"{meta.get('layout')}; this engine runs a {kind} over {_layout(engine)}. A torch "
                         "optimizer's state over chorus's partition does not reshard: load at the same data-parallel "
                         "size and ZeRO stage")
    state = {}
    for index, entry in meta["state"].items():
        state[int(index)] = {}
        for key, value in entry.items():
            if isinstance(value, dict) and "tensor" in value:
                dtype = getattr(torch, value["tensor"])
                raw = np.frombuffer(blobs[f"{index}:{key}"], dtype=np.uint8).copy()
                value = torch.from_numpy(raw).view(dtype).reshape(value["shape"])
            state[int(index)][key] = value
    groups = [{k: tuple(v) if isinstance(v, list) and k != "params" else v for k, v in g.items()}
              for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


def apply(engine, state):
    if state is not None:
        _client(engine).load_state_dict(state)
