"""A trained model as a file anyone can use: weights in safetensors, a model card beside them.

``<folder>/<client-id>.safetensors``
    The model's state dict in the safetensors format: tensors and names only,
    no pickle, no code; readable from Python, Rust, JavaScript, ...
``<folder>/<client-id>.json``
    The model card (:data:`CARD_KEYS`): whose model it is (``member``,
    ``client_id``), which run, strategy and settings made it, in which
    ``round`` and why it was kept, the member's score in that round as the run
    recorded it, the data ``schema`` it expects, the ``preprocessing`` applied
    to inputs, the ``model``'s name and constructor arguments, the package
    version, and the ``sha256`` of the weights file.

Both are written atomically and readable by their owner only
(:mod:`tasks.files`). :func:`load_model` refuses weights whose hash is not
the card's, and a card that names no model this package can build.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .files import atomic_write, strict_json
from .members import MemberSchema
from .models import MODELS

FORMAT = "fedamp-flwr-model/1"
WEIGHTS, CARD = ".safetensors", ".json"
#: the keys every card has
CARD_KEYS = ("format", "member", "client_id", "run", "run_token", "strategy", "settings",
             "training", "round", "why", "score", "dataset", "schema", "preprocessing", "model",
             "package", "weights", "sha256", "written_at")

#: how the app turns a file's inputs into the model's (tasks.data.to_tensors)
PREPROCESSING = {
    "uint8": "scaled to [-1, 1]: (x / 255 - 0.5) / 0.5",
    "other numbers": "converted to float32, otherwise as given",
    "image folders": "converted to the schema's channels (1: grey, 3: RGB) and resized to its "
                     "height and width (bilinear), then as uint8",
}


#: the largest input and output sizes a card may state (a card is untrusted: no model of
#: absurd size is built from it)
MAX_INPUTS, MAX_OUTPUTS = 10**8, 10**6


class ModelFileError(ValueError):
    """A model file or card that cannot be used (the message names the file and why)."""


def package_version() -> str:
    """This package's installed version ("unknown" when run from a source tree alone)."""
    try:
        return metadata.version("fedamp-flwr")
    except metadata.PackageNotFoundError:
        return "unknown"


def schema_record(schema: MemberSchema) -> dict[str, Any]:
    """A schema as the card holds it."""
    return {"input_shape": list(schema.input_shape), "task": schema.kind,
            "num_outputs": schema.num_outputs, "class_names": list(schema.class_names),
            "label_column": schema.label_column, "feature_columns": list(schema.feature_columns)}


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_model(folder: Path, stem: str, state: dict[str, torch.Tensor],
                card: dict[str, Any]) -> Path:
    """Write ``state`` as ``<folder>/<stem>.safetensors`` and ``card`` (completed with the
    format, the weights' name and sha256) as ``<stem>.json``; return the weights' path.

    The weights first, then the card: a card always describes the weights beside it
    (a reader that finds a card whose hash does not match caught a write half done).
    """
    from safetensors.torch import save

    bad = [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise ModelFileError(f"{folder / stem}: the model has non-finite values in {bad[:3]}; "
                             "not written (an earlier model there is kept)")
    weights = folder / f"{stem}{WEIGHTS}"
    data = save({k: v.detach().to("cpu").contiguous() for k, v in state.items()})
    full = {**strict_json(card), "format": FORMAT, "weights": weights.name,
            "sha256": hashlib.sha256(data).hexdigest()}
    text = json.dumps(full, indent=1, allow_nan=False)  # made before any file is touched
    atomic_write(weights, lambda f: f.write(data), private=True)
    atomic_write(folder / f"{stem}{CARD}", lambda f: f.write(text.encode()), private=True)
    return weights


def read_card(weights: Path) -> dict[str, Any]:
    """The card beside ``weights`` (``<stem>.json``), checked to be one of this format."""
    path = weights.with_suffix(CARD)
    try:
        card = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelFileError(f"{weights}: no model card {path.name} beside it") from None
    except (OSError, ValueError) as err:
        raise ModelFileError(f"{path}: not a readable model card ({err})") from None
    if not isinstance(card, dict) or card.get("format") != FORMAT:
        raise ModelFileError(f"{path}: not a model card of this app (format {FORMAT})")
    return card


@dataclass(frozen=True)
class LoadedModel:
    """A model rebuilt from its file: the module (in eval mode), its card, its schema."""

    model: nn.Module
    card: dict[str, Any]
    schema: MemberSchema


def card_schema(card: dict[str, Any], where: Path) -> MemberSchema:
    """The schema a card states, checked (a card is untrusted input)."""
    s = card.get("schema")
    try:
        assert isinstance(s, dict)
        shape = tuple(int(v) for v in s["input_shape"])
        assert shape and min(shape) >= 1 and all(float(v) == int(v) for v in s["input_shape"])
        kind, outputs = str(s["task"]), int(s["num_outputs"])
        assert kind in ("classification", "regression") and outputs >= 1
        assert math.prod(shape) <= MAX_INPUTS and outputs <= MAX_OUTPUTS
        names = tuple(str(v) for v in s.get("class_names", []))
        assert not names or len(names) == outputs
        columns = tuple(str(v) for v in s.get("feature_columns", []))
        return MemberSchema(shape, kind, outputs, names, str(s.get("label_column", "label")),
                            columns)
    except (AssertionError, KeyError, TypeError, ValueError):
        raise ModelFileError(f"{where}: the card's 'schema' = {str(s)[:300]} is not a schema "
                             "(input_shape, task, num_outputs, class names as many as outputs, "
                             "sizes within reason)") from None


def load_model(weights: str | Path) -> LoadedModel:
    """The model in ``weights`` (a ``.safetensors`` file with its card beside it), rebuilt.

    Raises :class:`ModelFileError` when the file's sha256 is not the card's, when the
    card names no model this package builds, or when the weights do not fit it.
    """
    from safetensors.torch import load

    path = Path(weights).expanduser()
    if path.suffix != WEIGHTS:
        raise ModelFileError(f"{path}: a model file ends with {WEIGHTS} (its card, .json, beside it)")
    card = read_card(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ModelFileError(f"{path}: cannot be read ({err})") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != card.get("sha256"):
        raise ModelFileError(f"{path}: its sha256 {digest[:16]}... is not the card's "
                             f"{str(card.get('sha256'))[:16]}...: the file was changed or is not "
                             "the one the card describes; refused")
    schema = card_schema(card, path.with_suffix(CARD))
    spec = card.get("model")
    name = spec.get("name") if isinstance(spec, dict) else None
    if name not in MODELS:
        raise ModelFileError(f"{path.with_suffix(CARD)}: the card's model {name!r} is not one of "
                             f"{sorted(MODELS)}")
    model = MODELS[name](schema.input_shape, schema.num_outputs)
    try:
        state = load(data)
        model.load_state_dict(state, strict=True)
    except Exception as err:
        raise ModelFileError(f"{path}: the weights do not fit the card's model {name!r} "
                             f"({type(err).__name__}: {str(err)[:300]})") from None
    return LoadedModel(model.eval(), card, schema)


def predict(model: nn.Module, x: torch.Tensor, batch_size: int = 500) -> torch.Tensor:
    """The model's outputs for inputs ``x`` (class probabilities: apply softmax yourself)."""
    model.eval()
    with torch.no_grad():
        outs = [model(x[i:i + batch_size]) for i in range(0, len(x), batch_size)]
    return torch.cat(outs) if outs else torch.empty(0)
