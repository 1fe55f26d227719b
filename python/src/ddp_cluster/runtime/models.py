"""Models sized for the data: an MLP for vectors (digits, synthetic), the manuals' LeNet ToyModel for images.

Every model starts with :class:`Standardize`, so it takes the dataset's stored values (uint8 pixels, say) as
they are; its constants are plain attributes, not buffers, so DDP has no buffers to broadcast each step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ddp_cluster.runtime.data import Data


class Standardize(nn.Module):
    def __init__(self, mean: float, std: float) -> None:
        super().__init__()
        self.mean = mean
        self.std = std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.float() - self.mean) / self.std

    def extra_repr(self) -> str:
        return f"mean={self.mean:g}, std={self.std:g}"


class MLP(nn.Module):
    def __init__(self, in_features: int, hidden: int, num_classes: int, mean: float = 0.0, std: float = 1.0):
        super().__init__()
        self.standardize = Standardize(mean, std)
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.standardize(x).flatten(1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)  # type: ignore[no-any-return]


class ToyModel(nn.Module):
    """LeNet-5 as in the vendor's DDP example, for 3x32x32 images; ``padding=2`` fits it to 1x28x28 MNIST."""

    def __init__(
        self,
        in_channels: int = 3,
        num_classes: int = 10,
        padding: int = 0,
        mean: float = 0.0,
        std: float = 1.0,
    ):
        super().__init__()
        self.standardize = Standardize(mean, std)
        self.conv1 = nn.Conv2d(in_channels, 6, 5, padding=padding)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(self.standardize(x))))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)  # type: ignore[no-any-return]


def build_model(data: Data) -> nn.Module:
    """The model for a dataset; its name is recorded in checkpoints so a resume cannot mix them up."""
    shape, classes = data.input_shape, data.num_classes
    mean, std = data.input_mean, data.input_std
    if len(shape) == 1:
        hidden = 128 if data.name == "digits" else 256
        return MLP(shape[0], hidden, classes, mean, std)
    if shape == (3, 32, 32):
        return ToyModel(3, classes, padding=0, mean=mean, std=std)
    if shape == (1, 28, 28):
        return ToyModel(1, classes, padding=2, mean=mean, std=std)
    raise ValueError(f"no model for inputs of shape {shape}")
