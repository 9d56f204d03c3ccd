"""The seed's dynamic process-set example, verbatim but for the import (8 ranks)."""
import os

import torch

import chorus.torch as hvd

rank_env = int(os.environ["CHORUS_RANK"])
feature_processor = torch.nn.Identity()
input_batch = torch.full((2, 3), float(rank_env))
classifier = torch.nn.Identity()
gathered_features = torch.zeros(6, 3)  # what the classifier ranks were handed
labels = torch.zeros(6, 3)


def compute_loss(predictions, labels):
    return ((predictions - labels) ** 2).mean() + rank_env


# ---- seed ----
# 启用动态进程组模式
hvd.init(process_sets="dynamic")
# 训练过程中根据需要创建进程组
feature_processor_set = hvd.add_process_set([0, 1, 2])
classifier_set = hvd.add_process_set([3, 4, 5])
# 模型并行训练流程
if feature_processor_set.included():
    # 特征处理层计算
    processed_features = feature_processor(input_batch)
    # 在特征处理器组内收集结果
    gathered_features = hvd.allgather(processed_features, process_set=feature_processor_set)
if classifier_set.included():
    # 分类器层计算
    predictions = classifier(gathered_features)
    loss = compute_loss(predictions, labels)
    # 在分类器组内聚合损失
    total_loss = hvd.allreduce(loss, process_set=classifier_set)
# 资源扩展时动态调整进程组
new_machines = [6, 7]
extended_feature_set = hvd.add_process_set([0, 1, 2] + new_machines)
# ---- end of seed ----

r = hvd.rank()
if r < 3:
    assert gathered_features[:, 0].tolist() == [0, 0, 1, 1, 2, 2]
if 3 <= r <= 5:
    assert abs(total_loss.item() - 4.0) < 1e-6  # mean of 3, 4, 5
assert extended_feature_set.ranks == [0, 1, 2, 6, 7]
assert extended_feature_set.included() == (r in (0, 1, 2, 6, 7))
if extended_feature_set.included():
    s = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=extended_feature_set)
    assert s.item() == 5
hvd.remove_process_set(extended_feature_set)
hvd.synchronize()
hvd.shutdown()
print(f"rank {r}: seed dynamic ok")
