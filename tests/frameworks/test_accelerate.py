"""Accelerate's DeepSpeed plugin over chorus.deepspeed: ZeRO-2, ZeRO-3, with and
without offload, 2 ranks. Losses equal one plain torch process on the global
batch; save_state / load_state resume exactly; get_state_dict gives its weights."""
import shutil

import pytest

from conftest import PYTHON, chorusrun, losses, run, single

TOL = 1e-5


@pytest.mark.parametrize("stage,offload", [(2, "none"), (3, "none"), (2, "offload"), (3, "offload")])
def test_accelerate_deepspeed_plugin(stage, offload, tmp_path):
    out = tmp_path / "run"
    got = losses(chorusrun(2, "accelerate_ds.py", stage, offload, out))
    want = losses(single("accelerate_ds.py", stage, offload, tmp_path / "ref", "--reference"))
    assert sorted(got) == list(range(1, 11)) and sorted(want) == sorted(got), (got, want)
    for step in got:
        assert abs(got[step] - want[step]) <= TOL * max(1.0, abs(want[step])), (step, got[step], want[step])

    resumed_dir = tmp_path / "resumed"
    shutil.copytree(out / "state", resumed_dir / "state")
    resumed = losses(chorusrun(2, "accelerate_ds.py", stage, offload, resumed_dir, "--resume"))
    assert sorted(resumed) == list(range(6, 11)), resumed
    for step in resumed:
        assert abs(resumed[step] - got[step]) <= TOL * max(1.0, abs(got[step])), (step, resumed[step], got[step])

    code = (f"import torch; a = torch.load({str(out / 'final.pt')!r}); b = torch.load({str(tmp_path / 'ref' / 'final.pt')!r}); "
            "assert sorted(a) == sorted(b), (sorted(a), sorted(b)); "
            "bad = [k for k in b if not torch.allclose(a[k], b[k], atol=1e-5)]; assert not bad, bad; print('equal')")
    assert "equal" in run([PYTHON, "-c", code])
