"""The seed's MPI example, verbatim but for the import; run under mpirun -np 4."""
import torch

import chorus.torch as hvd

layer_parameters = torch.full((3,), 1.0)  # the user's tensor

# ---- seed ----
# 在所有进程上执行
from mpi4py import MPI
# 获取全局MPI通信器
global_comm = MPI.COMM_WORLD
# 根据任务类型创建子通信器
task_subcomm = global_comm.Split(color=global_comm.rank // 2, key=global_comm.rank)
# 从MPI通信器创建进程组
task_process_set = hvd.ProcessSet(task_subcomm)
# 使用MPI通信器初始化Horovod
hvd.init(global_comm, process_sets=[task_process_set])
# 在各自子通信器内执行集体操作
result = hvd.allreduce(layer_parameters, process_set=task_process_set)
# ---- end of seed ----

r = hvd.rank()
assert hvd.size() == global_comm.size and r == global_comm.rank
assert task_process_set.ranks == [2 * (r // 2), 2 * (r // 2) + 1], task_process_set.ranks
assert task_process_set.rank() == r % 2
assert result.tolist() == [1.0] * 3  # Average over the pair
s = hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum, process_set=task_process_set)
assert s.item() == 4 * (r // 2) + 1, s
# The whole collective matrix over the global set works under mpirun too.
g = hvd.allgather(torch.tensor([r]))
assert g.tolist() == list(range(hvd.size()))
hvd.shutdown()
print(f"rank {r}: seed mpi ok", flush=True)
