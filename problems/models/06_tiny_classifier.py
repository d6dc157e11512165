"""A small image classifier returning logits and pooled features: conv stem, two stages, head."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, num_classes: int, width: int):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(2 * width, 4 * width, 3, stride=2, padding=1),
            nn.ReLU(),
        )
        self.head = nn.Linear(4 * width, num_classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pooled = self.features(x).mean(dim=(2, 3))
        return self.head(pooled), pooled


batch = 64
size = 128


def get_inputs():
    return [torch.randn(batch, 3, size, size)]


def get_init_inputs():
    return [1000, 64]
