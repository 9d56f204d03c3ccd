"""horovod.torch's public names on chorus.torch, the build queries, sparse allreduce, SyncBatchNorm."""
import copy
import os
import subprocess

import torch

import chorus
import chorus.torch as hvd

# horovod/torch/__init__.py of Horovod 0.28.1 (its imports, one by one).
HOROVOD_0_28_1 = """
check_extension gpu_available split_list Compression
allgather_object broadcast_object broadcast_optimizer_state broadcast_parameters
allreduce allreduce_async allreduce_ allreduce_async_
grouped_allreduce grouped_allreduce_async grouped_allreduce_ grouped_allreduce_async_
sparse_allreduce_async allgather allgather_async grouped_allgather grouped_allgather_async
broadcast broadcast_async broadcast_ broadcast_async_ alltoall alltoall_async
reducescatter reducescatter_async grouped_reducescatter grouped_reducescatter_async
join barrier poll synchronize init shutdown is_initialized start_timeline stop_timeline
size local_size cross_size rank local_rank cross_rank
mpi_threads_supported mpi_enabled mpi_built gloo_enabled gloo_built
nccl_built ddl_built ccl_built cuda_built rocm_built
ProcessSet global_process_set add_process_set remove_process_set
Average Sum Adasum Min Max Product HorovodInternalError DistributedOptimizer SyncBatchNorm
""".split()
# (horovod.torch.elastic is the elastic-training issue's.)
missing = [name for name in HOROVOD_0_28_1 if not hasattr(hvd, name)]
assert not missing, f"chorus.torch lacks {missing}"

try:
    hvd.mpi_threads_supported()
except ValueError as e:
    assert "init" in str(e)
else:
    raise AssertionError("mpi_threads_supported() before init() did not raise")
assert not hvd.mpi_enabled() and not hvd.gloo_enabled()  # nothing is enabled before init

hvd.init()
r, n = hvd.rank(), hvd.size()

# The build queries against what the core library links (ldd reads it independently).
core = os.path.join(os.path.dirname(chorus.__file__), "_core" + next(
    s for s in os.listdir(os.path.dirname(chorus.__file__)) if s.startswith("_core")).split("_core", 1)[1])
linked = subprocess.run(["ldd", core], stdout=subprocess.PIPE, text=True, check=True).stdout
assert hvd.mpi_built() == ("libmpi" in linked), linked
assert hvd.gloo_built() and "libgloo" in linked
assert not any(hvd_q() for hvd_q in (hvd.ddl_built, hvd.ccl_built, hvd.rocm_built))
# NCCL and CUDA are reached at run time, never linked: nccl_built() is the version of
# the libnccl.so.2 the loader finds (read here through ctypes), cuda_built() whether
# the CUDA backend library sits beside the core.
assert "libnccl" not in linked and "libcudart" not in linked and "libcuda" not in linked
try:
    import ctypes
    version = ctypes.c_int(0)
    ctypes.CDLL(os.environ.get("CHORUS_NCCL_LIBRARY") or "libnccl.so.2").ncclGetVersion(ctypes.byref(version))
    nccl = version.value
except OSError:
    nccl = 0
assert hvd.nccl_built() == nccl, (hvd.nccl_built(), nccl)
assert hvd.cuda_built() == os.path.exists(os.path.join(os.path.dirname(core), "libchorus_cuda.so"))
# chorusrun (no mpirun): chorus's own TCP controller, no MPI world.
assert hvd.gloo_enabled() and not hvd.mpi_enabled() and not hvd.mpi_threads_supported()
assert hvd.gpu_available("torch") == torch.cuda.is_available()
assert hvd.split_list(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
hvd.check_extension("chorus.torch", "CHORUS_WITH_PYTORCH", __file__)

# sparse_allreduce_async: each rank's COO entries, gathered; dense view = sum or mean.
def sparse_of(k):
    idx = torch.tensor([[k % 3, 2], [1, (k + 1) % 4]])
    return torch.sparse_coo_tensor(idx, torch.tensor([1.0 + k, -2.0 * k]), (3, 4))


for op, scale in ((hvd.Sum, 1.0), (hvd.Average, 1.0 / n)):
    got = hvd.sparse_allreduce_async(sparse_of(r), f"sparse.{op}", op)()
    assert got.is_sparse
    ref = sum(sparse_of(k).to_dense() for k in range(n)) * scale
    assert torch.allclose(got.to_dense(), ref), (got.to_dense(), ref)

# DistributedOptimizer with a sparse embedding gradient reduces it sparsely (the
# reference averages the dense gradients of every rank's batch).
torch.manual_seed(0)
template = torch.nn.Sequential(torch.nn.Embedding(10, 3, sparse=True), torch.nn.Linear(3, 1))


def batch(k):
    return torch.tensor([k, k + 1, 2 * k % 10])


model = copy.deepcopy(template)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
model(batch(r)).sum().backward()
opt.step()
ref = copy.deepcopy(template)
grads = []
for k in range(n):
    ref.zero_grad()
    ref(batch(k)).sum().backward()
    grads.append([p.grad.to_dense().clone() for p in ref.parameters()])
with torch.no_grad():
    for i, p in enumerate(ref.parameters()):
        p -= 0.1 * sum(g[i] for g in grads) / n
for p, q in zip(model.parameters(), ref.parameters()):
    assert torch.allclose(p, q, atol=1e-6), (p, q)

# SyncBatchNorm over ranks with different batch sizes against BatchNorm on the whole batch.
def images(k):
    g = torch.Generator().manual_seed(k)
    return torch.randn(k + 2, 3, 4, 4, generator=g, dtype=torch.float64)


def target(k):
    return torch.randn(k + 2, 3, 4, 4, generator=torch.Generator().manual_seed(50 + k), dtype=torch.float64)


sync = hvd.SyncBatchNorm(3, momentum=0.3).double()
with torch.no_grad():
    sync.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
    sync.bias.copy_(torch.tensor([0.0, -1.0, 0.25]))
plain = torch.nn.BatchNorm2d(3, momentum=0.3).double()
plain.load_state_dict(sync.state_dict())
x = images(r).requires_grad_()
out = sync(x)
(out * target(r)).sum().backward()
whole = torch.cat([images(k) for k in range(n)]).requires_grad_()
ref_out = plain(whole)
(ref_out * torch.cat([target(k) for k in range(n)])).sum().backward()
start = sum(k + 2 for k in range(r))
assert torch.allclose(out, ref_out[start:start + r + 2], atol=1e-10)
assert torch.allclose(x.grad, whole.grad[start:start + r + 2], atol=1e-10)  # the whole loss's gradient
assert torch.allclose(hvd.allreduce(sync.weight.grad, op=hvd.Sum), plain.weight.grad, atol=1e-10)
assert torch.allclose(sync.running_mean, plain.running_mean) and torch.allclose(sync.running_var, plain.running_var)
sync.eval()
plain.eval()
assert torch.allclose(sync(images(r)), plain(images(r)))
hvd.shutdown()
print(f"rank {r}: api ok")
