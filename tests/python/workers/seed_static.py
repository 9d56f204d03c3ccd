"""The seed's static process-set example, verbatim but for the import (6 ranks).

The names the seed leaves to the user (models, data, gradients) are defined first."""
import torch

import chorus.torch as hvd

rank_env = int(__import__("os").environ["CHORUS_RANK"])
encoder_model = torch.nn.Linear(4, 4)
input_data = torch.ones(2, 4)
encoder_gradients = torch.full((3,), float(rank_env))
decoder_model = torch.nn.Identity()
encoder_output = torch.zeros(2, 4)  # what the decoder ranks received from the encoders
decoder_params = torch.full((2,), float(rank_env))

# ---- seed ----
# 在所有进程上执行初始化
encoder_group = hvd.ProcessSet([0, 1, 2])  # 编码器进程组
decoder_group = hvd.ProcessSet([3, 4, 5])  # 解码器进程组
# 初始化Horovod并注册进程组
hvd.init(process_sets=[encoder_group, decoder_group])
# 编码器进程执行特定操作
if encoder_group.included():
    encoder_output = encoder_model(input_data)
    # 在编码器组内进行梯度聚合
    averaged_gradients = hvd.allreduce(encoder_gradients, process_set=encoder_group)
# 解码器进程执行特定操作
if decoder_group.included():
    decoder_output = decoder_model(encoder_output)
    # 在解码器组内进行参数同步
    synchronized_params = hvd.broadcast(decoder_params, root_rank=3, process_set=decoder_group)
# ---- end of seed ----

r = hvd.rank()
if r < 3:
    assert averaged_gradients.tolist() == [1.0] * 3  # mean of 0, 1, 2
    assert encoder_group.rank() == r and encoder_group.size() == 3 and not decoder_group.included()
else:
    assert synchronized_params.tolist() == [3.0, 3.0]
    assert decoder_group.rank() == r - 3
hvd.shutdown()
print(f"rank {r}: seed static ok")
