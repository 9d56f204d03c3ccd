"""The model shapes the peer benchmark trains: the same definitions, data and seed
under every framework."""
import json
import os

import torch.nn as nn
import torch.nn.functional as F


class DeepMLP(nn.Module):
    """Many small tensors (100 of 16-66K elements): where negotiation and fusion cost."""

    def __init__(self, depth=24, width=128, classes=10):
        super().__init__()
        self.inp = nn.Linear(3 * 32 * 32, width)
        self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(depth)])
        self.norms = nn.ModuleList([nn.LayerNorm(width) for _ in range(depth)])
        self.out = nn.Linear(width, classes)

    def forward(self, x):
        x = F.relu(self.inp(x.flatten(1)))
        for lin, norm in zip(self.layers, self.norms):
            x = x + F.relu(lin(norm(x)))
        return self.out(x)


class WideMLP(nn.Module):
    """A few large tensors (21M parameters in 6): where bandwidth counts."""

    def __init__(self, classes=10):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 4096), nn.ReLU(),
                                 nn.Linear(4096, 2048), nn.ReLU(), nn.Linear(2048, classes))

    def forward(self, x):
        return self.net(x)


class ConvNet(nn.Module):
    """A small residual-free conv net for 32x32 images (compute-heavy, 0.3M parameters)."""

    def __init__(self, classes=10, width=32):
        super().__init__()
        layers, c = [nn.Conv2d(3, width, 3, padding=1, bias=False), nn.ReLU(inplace=True)], width
        for stage, out_c in enumerate([width, 2 * width, 4 * width]):
            layers += [nn.Conv2d(c, out_c, 3, stride=1 if stage == 0 else 2, padding=1, bias=False),
                       nn.BatchNorm2d(out_c), nn.ReLU(inplace=True),
                       nn.Conv2d(out_c, out_c, 3, padding=1, bias=False), nn.BatchNorm2d(out_c),
                       nn.ReLU(inplace=True)]
            c = out_c
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, classes)]
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


MODELS = {"deep_mlp": DeepMLP, "wide_mlp": WideMLP, "convnet": ConvNet}


class ZeroMLP(nn.Module):
    """The ZeRO comparison's model: a stack of square Linear layers (8.4M parameters
    at the defaults), one fp32 loss per step."""

    def __init__(self, width=1024, depth=8, classes=10):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(depth)])
        self.out = nn.Linear(width, classes)

    def forward(self, x):
        for lin in self.layers:
            x = F.gelu(lin(x))
        return self.out(x)


def report(result):
    """Prints a rank's result and writes it where bench/peers/run.py collects it
    ($PEERS_RESULT_DIR/rank-N.json: launchers may interleave ranks' stdout)."""
    text = json.dumps(result)
    print("PEERS_RESULT " + text, flush=True)
    where = os.environ.get("PEERS_RESULT_DIR")
    if where:
        path = os.path.join(where, f"rank-{result['rank']}.json")
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
