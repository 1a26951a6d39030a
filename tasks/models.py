"""Target models of the tasks."""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    """A multi-layer perceptron with ReLU activations.

    Parameters
    ----------
    in_features : int
        Input dimension.
    out_features : int
        Output dimension (number of classes).
    hidden : tuple[int, ...]
        Widths of the hidden layers.
    """

    def __init__(self, in_features: int, out_features: int, hidden: tuple[int, ...] = (64, 64)) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, out_features))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))


class McMahanCNN(nn.Module):
    """The CNN of McMahan et al. (2017) used by the FedAMP paper for (F)MNIST/EMNIST.

    Two 5x5 convolutions with 32 and 64 channels ("same" padding), each
    followed by ReLU and 2x2 max pooling, a 512-unit dense layer with ReLU and
    a linear output layer (softmax is applied by the loss). For 28x28 inputs
    and 10 classes it has 1,663,370 parameters.
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        )
        flat = 64 * (image_size // 4) ** 2
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(flat, 512), nn.ReLU(), nn.Linear(512, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def resnet18(num_classes: int) -> nn.Module:
    """torchvision's ResNet-18 with a stem for 32x32 inputs (CIFAR).

    The 7x7 stride-2 first convolution becomes 3x3 stride 1 and the first max
    pooling is dropped, the usual adaptation for CIFAR images. torchvision is
    imported here only, so that tasks without ResNet-18 never load it.
    """
    import torchvision  # noqa: PLC0415 - see module docstring of tasks/__init__.py

    model = torchvision.models.resnet18(num_classes=num_classes)
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model
