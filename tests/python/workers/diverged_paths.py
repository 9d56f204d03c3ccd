"""Ranks on different code paths (a rank gave up on a collective and went on):
every rank blocks on an op the others never submit. Past CHORUS_BLOCKED_FAIL_SECONDS
those ops fail on every rank with an error naming them, and the set stays usable;
with names in the response cache as with new ones."""
import torch

import chorus.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
t = torch.ones(3)
for _ in range(3):  # these names are in the response cache afterwards
    hvd.allreduce(t, name="x")
    hvd.allreduce(t, name="y")


def diverge(call, mine):
    try:
        call()
        raise AssertionError("a collective no other rank submitted completed")
    except hvd.HorovodInternalError as e:
        assert not isinstance(e, ValueError), type(e).__mro__
        assert "never submitted" in str(e) and f"'{mine}'" in str(e), e
        assert f"never by ranks [{(r + 1) % n}" in str(e) or n > 2, e


diverge(lambda: hvd.allgather(t, name="path0") if r == 0 else hvd.allreduce(t, name=f"path{r}"),
                 "allgather.path0" if r == 0 else f"allreduce.path{r}")
diverge(lambda: hvd.allreduce(t, name="x" if r == 0 else "y"), "allreduce.x" if r == 0 else "allreduce.y")
# The set goes on, cached names and new ones alike.
assert hvd.allreduce(t, op=hvd.Sum, name="x").tolist() == [float(n)] * 3
assert hvd.allgather(torch.tensor([r]), name="after").tolist() == list(range(n))
print(f"rank {r}: diverged paths ok", flush=True)
