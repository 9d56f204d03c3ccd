"""DeepSpeed's .pt files are read without trusting them (chorus.deepspeed.checkpoint.ds_pickle):
tensors, containers and DeepSpeed's own records come back as torch.load gives them; a file
that names any other global (a function to call) is refused by name, as is a view outside its
storage or a compressed member (which could stand for more memory than the file holds); a
truncated file or a checkpoint folder missing a rank's file is named. (Real DeepSpeed checkpoints are loaded in
tests/frameworks/test_checkpoint_vs_deepspeed.py.)"""
import collections
import os
import pickle
import zipfile

import pytest
import torch

from chorus.deepspeed.checkpoint.deepspeed_format import DeepSpeedCheckpoint
from chorus.deepspeed.checkpoint.ds_pickle import load


def test_tensors_and_containers_load_as_torch_gives_them(tmp_path):
    value = {"module": collections.OrderedDict(w=torch.arange(6.).view(2, 3), b=torch.ones(2, dtype=torch.bfloat16)),
             "steps": 3, "shape": torch.Size([2, 3]), "slice": torch.arange(10)[2:5], "names": ["w", "b"]}
    torch.save(value, tmp_path / "f.pt")
    got = load(str(tmp_path / "f.pt"))
    assert got["steps"] == 3 and got["shape"] == torch.Size([2, 3]) and got["names"] == ["w", "b"]
    assert torch.equal(got["module"]["w"], value["module"]["w"]) and got["module"]["b"].dtype == torch.bfloat16
    assert torch.equal(got["slice"], torch.tensor([2, 3, 4]))


def test_a_file_that_names_a_function_is_refused(tmp_path):
    torch.save({"payload": os.system}, tmp_path / "evil.pt")
    with pytest.raises(pickle.UnpicklingError, match="posix.system|os.system"):
        load(str(tmp_path / "evil.pt"))


def test_views_outside_their_storage_and_compressed_members_are_refused(tmp_path):
    from chorus.deepspeed.checkpoint.ds_pickle import _rebuild_tensor
    one = torch.zeros(1)
    with pytest.raises(pickle.UnpicklingError, match="does not lie inside its storage"):
        _rebuild_tensor(one, 0, (2 ** 34,), (0,))  # one element standing for 2**34
    with pytest.raises(pickle.UnpicklingError, match="does not lie inside"):
        _rebuild_tensor(torch.zeros(6), 4, (2, 2), (2, 1))
    assert torch.equal(_rebuild_tensor(torch.arange(6.), 1, (2, 2), (2, 1)), torch.tensor([[1., 2.], [3., 4.]]))
    torch.save({"x": torch.zeros(4)}, tmp_path / "f.pt")
    with zipfile.ZipFile(tmp_path / "f.pt") as z, zipfile.ZipFile(tmp_path / "packed.pt", "w",
                                                                   zipfile.ZIP_DEFLATED) as out:
        for item in z.infolist():
            out.writestr(item.filename, z.read(item.filename))
    with pytest.raises(ValueError, match="compressed members"):
        load(str(tmp_path / "packed.pt"))


def test_damaged_files_and_missing_ranks_are_named(tmp_path):
    torch.save({"x": torch.zeros(1000)}, tmp_path / "f.pt")
    with zipfile.ZipFile(tmp_path / "f.pt") as z:  # the same archive with the tensor's bytes cut short
        with zipfile.ZipFile(tmp_path / "cut.pt", "w") as out:
            for item in z.infolist():
                data = z.read(item.filename)
                out.writestr(item, data[:100] if "/data/" in item.filename else data)
    with pytest.raises(ValueError, match="truncated or altered"):
        load(str(tmp_path / "cut.pt"))
    (tmp_path / "junk.pt").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a torch zip file"):
        load(str(tmp_path / "junk.pt"))
    folder = tmp_path / "t"
    folder.mkdir()
    torch.save({"module": {}, "dp_world_size": 2, "mp_world_size": 1, "param_shapes": [{"w": torch.Size([2])}],
                "ds_config": {"zero_optimization": {"stage": 2}}}, folder / "mp_rank_00_model_states.pt")
    torch.save({"optimizer_state_dict": {}}, folder / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    with pytest.raises(ValueError, match=r"ranks \[0\] \(missing: \[1\]\)"):
        DeepSpeedCheckpoint(str(folder))


def test_a_folder_mixing_two_saves_and_a_corrupted_storage_are_refused(tmp_path):
    folder = tmp_path / "t"
    folder.mkdir()
    torch.save({"module": {}, "dp_world_size": 2, "mp_world_size": 1, "param_shapes": [{"w": torch.Size([4])}],
                "ds_config": {"zero_optimization": {"stage": 2}}}, folder / "mp_rank_00_model_states.pt")

    def rank_file(r, step):
        state = {0: {"step": step, "exp_avg": torch.zeros(2), "exp_avg_sq": torch.zeros(2)}}
        torch.save({"optimizer_state_dict": {
            "base_optimizer_state": {"state": state, "param_groups": [{"lr": 0.1, "params": [0]}]},
            "single_partition_of_fp32_groups": [torch.full((2,), float(r))], "partition_count": [2],
            "group_paddings": [0], "ds_version": "0.19.8"}}, folder / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")

    rank_file(0, 3)
    rank_file(1, 3)
    ck = DeepSpeedCheckpoint(str(folder))  # one save: its halves join
    assert torch.equal(ck.fp32["w"], torch.tensor([0., 0., 1., 1.])) and ck.step == 3
    rank_file(1, 5)  # rank 1's file from a later save under the same tag
    with pytest.raises(ValueError, match=r"zero_pp_rank_1_mp_rank_00_optim_states.pt is not of the same save"):
        DeepSpeedCheckpoint(str(folder))
    torch.save({"x": torch.arange(1000.)}, tmp_path / "f.pt")
    raw = bytearray((tmp_path / "f.pt").read_bytes())
    at = raw.find(torch.arange(1000.).numpy().tobytes()[400:408])
    raw[at] ^= 0xFF  # one byte of the tensor's data flipped, the zip's sizes intact
    (tmp_path / "flipped.pt").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="does not match its CRC-32: corrupted"):
        load(str(tmp_path / "flipped.pt"))
