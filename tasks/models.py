"""Target models of the tasks, by name (the ``model`` run-config key).

:data:`MODELS` builds a model from the data's input shape and number of
outputs; each task names its own (:data:`MODEL_OF_TASK`), and
:func:`auto_model` picks one from the input shape alone (a run over members'
own data, ``dataset = "members"``): a vector gives the MLP, a one-channel image
or a small image the CNN, a three-channel image of 32x32 or more ResNet-18.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
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

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28,
                 image_width: int | None = None) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        )
        flat = 64 * (image_size // 4) * ((image_width or image_size) // 4)
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(flat, 512), nn.ReLU(), nn.Linear(512, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class GRUSeq2Seq(nn.Module):
    """A GRU encoder-decoder for one sensor's series (the per-node model of Meng et al. 2021,
    CNFGNN, which the Panacea paper's traffic setup follows): a one-layer GRU reads the
    ``steps_in`` past readings; from its last state a GRU cell unrolls ``steps_out`` steps, each
    fed the previous prediction (the last reading first), and a linear head maps each state
    to a reading. ``hidden`` 64 units: 25,793 parameters."""

    def __init__(self, steps_out: int, hidden: int = 64) -> None:
        super().__init__()
        self.steps_out = steps_out
        self.encoder = nn.GRU(1, hidden, batch_first=True)
        self.decoder = nn.GRUCell(1, hidden)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[0], -1, 1)
        _, h = self.encoder(x)
        state, reading = h[0], x[:, -1]
        out = []
        for _ in range(self.steps_out):  # a loop over forecast steps, 12
            state = self.decoder(reading, state)
            reading = self.head(state)
            out.append(reading)
        return torch.cat(out, dim=1)


def resnet18(num_classes: int) -> nn.Module:
    """torchvision's ResNet-18 with a stem for 32x32 inputs (CIFAR).

    The 7x7 stride-2 first convolution becomes 3x3 stride 1 and the first max
    pooling is dropped, the usual adaptation for CIFAR images. torchvision is
    imported here only, so that tasks without ResNet-18 never load it.
    """
    import torchvision  # only the CIFAR tasks need it (see tasks/loading.py)

    model = torchvision.models.resnet18(num_classes=num_classes)
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


Shape = tuple[int, ...]

#: Model builders by name: ``(input shape, outputs) -> a freshly initialised model``.
MODELS: dict[str, Callable[[Shape, int], nn.Module]] = {
    "mlp": lambda shape, out: MLP(int(np.prod(shape)), out, (64, 64)),
    # one layer: multinomial logistic regression (cross-entropy), or least squares
    # (regression), the model a member's analysts fit and trust, personalized by the run
    "linear": lambda shape, out: MLP(int(np.prod(shape)), out, ()),
    "mlp-16": lambda shape, out: MLP(int(np.prod(shape)), out, (16,)),
    "cnn": lambda shape, out: McMahanCNN(shape[0], out, shape[1], shape[2]),
    "resnet18": lambda shape, out: resnet18(out),
    "gru": lambda shape, out: GRUSeq2Seq(out),
}

#: The model of each task (what ``model = "auto"`` gives there).
MODEL_OF_TASK = {"synthetic": "mlp", "mnist": "cnn", "fmnist": "cnn", "emnist": "cnn",
                 "cifar10": "resnet18", "cifar100": "resnet18", "fl60": "mlp-16",
                 "tpt48": "mlp", "npz": "mlp", "metr-la": "gru", "pems-bay": "gru",
                 "traffic-generated": "gru", "compcars": "cnn"}


def auto_model(shape: Shape) -> str:
    """The model for inputs of ``shape`` when nothing names one: a vector, the MLP; an image
    (channels, height, width), the CNN, or ResNet-18 for 3 channels of 32x32 or more."""
    if len(shape) == 3:
        return "resnet18" if shape[0] == 3 and min(shape[1:]) >= 32 else "cnn"
    return "mlp"


def model_problem(name: str, shape: Shape) -> str | None:
    """Why model ``name`` cannot take inputs of ``shape``, or None."""
    if name == "gru" and len(shape) != 1:
        return f"model 'gru' needs a series of readings (one dimension), not shape {shape}"
    if name in ("cnn", "resnet18") and len(shape) != 3:
        return f"model '{name}' needs image inputs (channels, height, width), not shape {shape}"
    if name == "cnn" and min(shape[1:]) < 4:
        return f"model 'cnn' needs images of at least 4x4, not {shape}"
    if name == "resnet18" and shape[0] != 3:
        return f"model 'resnet18' needs 3-channel images, not shape {shape}"
    return None
