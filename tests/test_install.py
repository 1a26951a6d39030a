"""The install: torch and torchvision are a matching pair, whose compiled ops load.

torchvision's compiled ops (``torchvision::nms`` and the rest, in its ``_C``
library) load only beside the torch build they were made for: PyPI's CUDA
torchvision beside a CPU torch of the same version fails at ``import
torchvision`` with ``operator torchvision::nms does not exist``. The CIFAR tasks
(ResNet-18, ``tasks/models.py``) need them, so a broken pair fails here, once,
with the way out, rather than as a skip (``tests/test_batchnorm.py`` skips its
ResNet-18 runs where the ops do not load, pointing here).
"""

from __future__ import annotations

from importlib import metadata

import pytest
import torch

HOW = ("install torch and torchvision as a matching pair, from one index, before the app: "
       "pip install torch==2.14.1 torchvision==0.29.1 (CPU only: add --index-url "
       "https://download.pytorch.org/whl/cpu), then pip install -e '.[dev]' "
       "(README.md, section Install)")


def _installed(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def test_torchvision_compiled_ops_load_beside_this_torch():
    pair = f"torch {_installed('torch')}, torchvision {_installed('torchvision')}"
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0],     # kept: the highest score
                          [1.0, 1.0, 11.0, 11.0],     # IoU 81/119 with the first: dropped
                          [20.0, 20.0, 30.0, 30.0]])  # overlaps nothing: kept
    try:
        import torchvision.ops

        kept = torchvision.ops.nms(boxes, torch.tensor([0.9, 0.8, 0.7]), iou_threshold=0.5)
    except Exception as err:  # an import that fails, or an op that is not registered
        problem = f"{type(err).__name__}: {err}"
    else:
        assert kept.tolist() == [0, 2], (pair, kept)
        return
    pytest.fail(f"torchvision's compiled ops do not load ({pair}): {problem}. To fix: {HOW}",
                pytrace=False)
