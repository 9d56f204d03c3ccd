# The DeepSpeed example of ../shared/seeds/horovod-and-deepspeed.txt with the import
# changed to chorus. With a GPU it runs as the seed wrote it (.cuda()); without
# one, .cuda() becomes .to("cpu"), and fp16 becomes bf16 where this CPU's torch
# cannot compute in fp16.
#     ./build/chorusrun -np 2 /usr/bin/python3 examples/deepspeed/seed_simple.py
import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import Dataset, DataLoader
import chorus.deepspeed as deepspeed
import os

device = "cuda" if torch.cuda.is_available() else "cpu"


def cpu_computes_fp16():
    try:
        nn.Linear(2, 2).half()(torch.ones(1, 2, dtype=torch.float16))
        return True
    except RuntimeError:
        return False


# 1. 定义模型
class SimpleModel(nn.Module):
    def __init__(self, input_size, hidden_size, output_size):
        super(SimpleModel, self).__init__()
        self.fc1 = nn.Linear(input_size, hidden_size)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(hidden_size, output_size)

    def forward(self, x):
        out = self.fc1(x)
        out = self.relu(out)
        out = self.fc2(out)
        return out

# 2. 定义数据集
class SimpleDataset(Dataset):
    def __init__(self, num_samples, input_size):
        self.num_samples = num_samples
        self.input_size = input_size
        self.data = torch.randn(num_samples, input_size)
        self.labels = torch.randint(0, 2, (num_samples,))

    def __len__(self):
        return self.num_samples

    def __getitem__(self, idx):
        return self.data[idx], self.labels[idx]

# 3. 初始化 DeepSpeed
def initialize_deepspeed(model, optimizer, config_params):
    model_engine, optimizer, _, _ = deepspeed.initialize(
        model=model,
        optimizer=optimizer,
        config_params=config_params
    )
    return model_engine, optimizer

# 4. 训练循环
def train(model_engine, optimizer, dataloader, epochs):
    for epoch in range(epochs):
        for i, (inputs, labels) in enumerate(dataloader):
            if device == "cuda":
                inputs = inputs.cuda()
                labels = labels.cuda()
            else:
                inputs = inputs.to(device)
                labels = labels.to(device)

            outputs = model_engine(inputs)
            loss = nn.CrossEntropyLoss()(outputs, labels)

            model_engine.backward(loss)
            model_engine.step()

            if i % 10 == 0:
                print(f'Epoch [{epoch+1}/{epochs}], Step [{i+1}/{len(dataloader)}], Loss: {loss.item():.4f}')

if __name__ == '__main__':
    # 5. 设置参数
    input_size = 10
    hidden_size = 20
    output_size = 2
    num_samples = 1000
    batch_size = 32
    learning_rate = 0.001
    epochs = 5

    # 6. 创建模型、优化器和数据集
    model = SimpleModel(input_size, hidden_size, output_size)
    optimizer = optim.Adam(model.parameters(), lr=learning_rate)
    dataset = SimpleDataset(num_samples, input_size)
    dataloader = DataLoader(dataset, batch_size=batch_size, shuffle=True)

    # 7. DeepSpeed 配置
    config_params = {
        "train_batch_size": batch_size,
        "train_micro_batch_size_per_gpu": batch_size // int(os.environ.get("WORLD_SIZE", 1)), # 保证每个GPU的micro batch size 一致
        "optimizer": {
            "type": "Adam",
            "params": {
                "lr": learning_rate
            }
        },
        "zero_optimization": {
            "stage": 2, # 使用 ZeRO 优化
            "offload_optimizer": {
                "device": "cpu",
                "pin_memory": True
            },
            "offload_param": {
                "device": "cpu",
                "pin_memory": True
            }
        } ,
        "fp16": {
            "enabled": True,
            "loss_scale": 0,
            "loss_scale_window": 1000,
            "initial_scale_power": 16,
            "hysteresis": 2,
            "min_loss_scale": 1
        },
    }
    if device == "cpu" and not cpu_computes_fp16():
        config_params["bf16"] = {"enabled": True}
        config_params["fp16"]["enabled"] = False

    # 8. 初始化 DeepSpeed
    model_engine, optimizer = initialize_deepspeed(model, optimizer, config_params)
    if device == "cuda":
        model_engine.cuda() # 将模型加载到GPU
    else:
        model_engine.to(device)

    # 9. 训练模型
    train(model_engine, optimizer, dataloader, epochs)
