"""The GPU bench's models, one definition for all three sides (bench/gpu/bench.py).

    python3 bench/gpu/models.py --out DIR     # writes DIR/{mlp,cnn,resnet18}.pt (TorchScript)

Each takes a batch of flat feature rows (the synthetic data of ddp-trainer's
`data.synthetic`, and of the other two sides) and returns logits for 10 classes:

  mlp       64 -> 256 -> 256 -> 10 (bench/jobs/mlp85k.yaml's MLP, 85k parameters)
  cnn       784 = 1x28x28: the Fashion-MNIST CNN (2 convolutions, 32 and 64 channels,
            max-pool, 128-wide linear layer), 0.4M parameters
  resnet18  3072 = 3x32x32: ResNet-18 (BasicBlock [2, 2, 2, 2], widths 64-512, the CIFAR
            stem: one 3x3 convolution, no max-pool), 11.2M parameters, BatchNorm buffers

PyTorch's side trains these modules eagerly; ddp-trainer (model.torchscript) and the
libddp program (ddp-bench-gpu) load the scripted copies written here.
"""
import argparse
import os

import torch
from torch import nn

FEATURES = {"mlp": 64, "cnn": 784, "resnet18": 3072}
CLASSES = 10


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                 nn.Linear(256, CLASSES))

    def forward(self, x):
        return self.net(x)


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3),
                                      nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(64 * 12 * 12, 128), nn.ReLU(),
                                  nn.Linear(128, CLASSES))

    def forward(self, x):
        return self.head(self.features(x.view(-1, 1, 28, 28)))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU())
        layers = []
        cin = 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(512, CLASSES)

    def forward(self, x):
        out = self.layers(self.stem(x.view(-1, 3, 32, 32)))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(out, 1), 1))


MODELS = {"mlp": Mlp, "cnn": Cnn, "resnet18": ResNet18}


def make(name):
    torch.manual_seed(0)
    return MODELS[name]()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default=",".join(MODELS))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for name in a.models.split(","):
        m = make(name)
        params = sum(p.numel() for p in m.parameters())
        path = os.path.join(a.out, f"{name}.pt")
        torch.jit.save(torch.jit.script(m), path)
        print(f"{path}: {name}, {params:,} parameters, {FEATURES[name]} features")


if __name__ == "__main__":
    main()
