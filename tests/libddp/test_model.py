"""The model and data of libddp's parity references (parity_reference.py,
comm_hook_reference.py): a small BatchNorm MLP with a frozen parameter and seeded random
data, the PyTorch twin of test_model.h, which the C++ programs they are held to train
(parity_program.cc, comm_hook_program.cc). The two must stay the same module for module
and seed for seed.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

N, FEATURES, CLASSES = 46, 10, 3


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, 16)
        self.bn = nn.BatchNorm1d(16)
        self.fc2 = nn.Linear(16, 16)
        self.head = nn.Linear(16, CLASSES)
        self.fc1.bias.requires_grad_(False)  # The frozen parameter.

    def forward(self, x):
        h = F.relu(self.bn(self.fc1(x)))
        h = F.relu(self.fc2(h))
        return self.head(h)


def seeded_net_and_data():
    """(net, x, y): the model initialized under seed 0, then N samples of FEATURES
    features and labels in [0, CLASSES) drawn under seed 1, as SeededNetAndData()."""
    torch.manual_seed(0)
    net = Net()
    torch.manual_seed(1)
    x = torch.randn(N, FEATURES)
    y = torch.randint(0, CLASSES, (N,))
    return net, x, y
