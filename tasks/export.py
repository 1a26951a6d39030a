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
the card's, and a card that names no model this package can build. Both files
are untrusted input: the card's model is first built on torch's meta device
(nothing allocated) and compared, with :data:`MAX_PARAMETERS`, to the names and
shapes of the weights file's header alone (:func:`read_header`); only then is
the file hashed, read and the model built.
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
from .models import MODELS, model_problem

FORMAT = "fedamp-flwr-model/1"
WEIGHTS, CARD = ".safetensors", ".json"
#: the keys every card has
CARD_KEYS = ("format", "member", "client_id", "run", "run_token", "strategy", "settings",
             "training", "round", "why", "score", "rows", "dataset", "schema", "preprocessing",
             "model", "package", "weights", "sha256", "written_at")

#: how the app turns a file's inputs into the model's (tasks.data.to_tensors)
PREPROCESSING = {
    "uint8": "scaled to [-1, 1]: (x / 255 - 0.5) / 0.5",
    "other numbers": "converted to float32, otherwise as given",
    "image folders": "converted to the schema's channels (1: grey, 3: RGB) and resized to its "
                     "height and width (bilinear), then as uint8",
}


#: the largest input and output sizes a card may state (a card is untrusted: no model of
#: absurd size is built from it); also the largest a run's ``member-input-shape`` (the
#: product of its dimensions) and ``member-outputs`` may be
MAX_INPUTS, MAX_OUTPUTS = 10**8, 10**5
#: the most values (parameters and buffers) the model a card describes may have: ResNet-18
#: has 11 million, the MNIST CNN 1.7 million; a card of a larger model is refused before
#: anything is built or read
MAX_PARAMETERS = 10**8
#: the longest safetensors header (the JSON of the tensors' names, dtypes and shapes, a few
#: kB for this package's models) :func:`read_header` reads, and the longest model card
MAX_HEADER = 10**7
#: bytes per value of the safetensors dtypes a weights file may use
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
               "U8": 1, "BOOL": 1}


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
            "label_column": schema.label_column, "feature_columns": list(schema.feature_columns),
            "categories": [[c, list(v)] for c, v in schema.categories]}


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
        with open(path, "rb") as f:
            text = f.read(MAX_HEADER + 1)
        if len(text) > MAX_HEADER:
            raise ValueError(f"longer than {MAX_HEADER} bytes (MAX_HEADER)")
        card = json.loads(text)
    except FileNotFoundError:
        raise ModelFileError(f"{weights}: no model card {path.name} beside it") from None
    except (OSError, ValueError, RecursionError) as err:
        raise ModelFileError(f"{path}: not a readable model card ({type(err).__name__})"
                             if isinstance(err, RecursionError) else
                             f"{path}: not a readable model card ({err})") from None
    if not isinstance(card, dict) or card.get("format") != FORMAT:
        raise ModelFileError(f"{path}: not a model card of this app (format {FORMAT})")
    return card


def _require(condition: object) -> None:
    """A check of untrusted input that holds under ``python -O`` too (unlike ``assert``)."""
    if not condition:
        raise ValueError("not as required")


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
        if not isinstance(s, dict):
            raise ValueError("not a mapping")
        shape = tuple(int(v) for v in s["input_shape"])
        _require(shape and min(shape) >= 1 and all(float(v) == int(v) for v in s["input_shape"]))
        kind, outputs = str(s["task"]), int(s["num_outputs"])
        _require(kind in ("classification", "regression") and outputs >= 1)
        _require(math.prod(shape) <= MAX_INPUTS and outputs <= MAX_OUTPUTS)
        names = tuple(str(v) for v in s.get("class_names", []))
        _require(not names or len(names) == outputs)
        columns = tuple(str(v) for v in s.get("feature_columns", []))
        _require(isinstance(s.get("categories", []), list))
        categories = tuple((str(c), tuple(str(v) for v in values))
                           for c, values in s.get("categories", []))
        _require(sum(len(v) for _, v in categories) <= MAX_INPUTS
                 and all(v and len(set(v)) == len(v) for _, v in categories)
                 and len({c for c, _ in categories}) == len(categories))
        return MemberSchema(shape, kind, outputs, names, str(s.get("label_column", "label")),
                            columns, categories)
    except (KeyError, TypeError, ValueError):
        raise ModelFileError(f"{where}: the card's 'schema' = {str(s)[:300]} is not a schema "
                             "(input_shape, task, num_outputs, class names as many as outputs, "
                             "categories distinct, sizes within reason)") from None


def read_header(path: Path) -> tuple[dict[str, tuple[int, ...]], int]:
    """The tensors of safetensors file ``path`` (name -> shape) and the file's size, from its
    header alone (the first 8 bytes give the header's length, at most :data:`MAX_HEADER`),
    checked against the file's size: no tensor's data is read."""
    def refuse(why: str) -> ModelFileError:
        return ModelFileError(f"{path}: not a safetensors file of this app ({why}); refused")

    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            length = int.from_bytes(head, "little")
            if len(head) < 8 or length > min(MAX_HEADER, size - 8):
                raise refuse(f"a header of {length} bytes in a file of {size}; at most "
                             f"{MAX_HEADER} (MAX_HEADER)")
            text = f.read(length)
    except OSError as err:
        raise ModelFileError(f"{path}: cannot be read ({err})") from None
    try:
        header = json.loads(text)
        _require(isinstance(header, dict))
    except (RecursionError, ValueError):
        raise refuse("its header is not a JSON object") from None
    shapes: dict[str, tuple[int, ...]] = {}
    end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, stop) = entry["dtype"], entry["shape"], entry["data_offsets"]
            _require(dtype in DTYPE_BYTES and isinstance(shape, list))
            _require(all(type(v) is int and v >= 0 for v in (*shape, begin, stop)))
            _require(stop - begin == math.prod(shape) * DTYPE_BYTES[dtype])
        except (KeyError, TypeError, ValueError):
            raise refuse(f"tensor {str(name)[:100]!r}: {str(entry)[:200]} is not a dtype of "
                         f"{sorted(DTYPE_BYTES)}, a shape and the offsets of its data") from None
        shapes[name] = tuple(shape)
        end = max(end, stop)
    if size != 8 + length + end:
        raise refuse(f"{size} bytes, where its header describes {8 + length + end}")
    return shapes, size


def card_model_shapes(name: str, schema: MemberSchema, where: Path) -> dict[str, tuple[int, ...]]:
    """The state dict's shapes of model ``name`` for ``schema``, from the model built on torch's
    meta device (nothing allocated); a ModelFileError naming ``where`` (the card) if it cannot
    be built here or has more than :data:`MAX_PARAMETERS` values."""
    shape, outputs = schema.input_shape, schema.num_outputs
    problem = model_problem(name, shape)
    if problem is not None:
        raise ModelFileError(f"{where}: the card's model {name!r} does not fit its schema "
                             f"({problem})")
    try:
        with torch.device("meta"):
            state = MODELS[name](shape, outputs).state_dict()
    except Exception as err:  # e.g. ResNet-18 where torchvision does not load
        raise ModelFileError(f"{where}: the card's model {name!r} cannot be built here "
                             f"({type(err).__name__}: {str(err)[:200]})") from None
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    count = sum(math.prod(s) for s in shapes.values())
    if count > MAX_PARAMETERS:
        raise ModelFileError(f"{where}: the card's model {name!r} for inputs of shape "
                             f"{list(shape)} and {outputs} outputs would have {count:,} values, "
                             f"more than {MAX_PARAMETERS:,} (MAX_PARAMETERS); refused, nothing "
                             "built")
    return shapes


def load_model(weights: str | Path) -> LoadedModel:
    """The model in ``weights`` (a ``.safetensors`` file with its card beside it), rebuilt.

    Nothing the files state is allocated before it is checked: the card's schema and
    model (built on the meta device, at most :data:`MAX_PARAMETERS` values) against the
    names and shapes of the weights file's header; then the file's sha256 (read in
    blocks) against the card's; then the file is read and the model built.

    Raises :class:`ModelFileError` when the card names no model this package builds (or
    one too large), when the weights do not fit it, or when the file's sha256 is not
    the card's.
    """
    from safetensors.torch import load

    path = Path(weights).expanduser()
    if path.suffix != WEIGHTS:
        raise ModelFileError(f"{path}: a model file ends with {WEIGHTS} (its card, .json, beside it)")
    card = read_card(path)
    where = path.with_suffix(CARD)
    schema = card_schema(card, where)
    spec = card.get("model")
    name = spec.get("name") if isinstance(spec, dict) else None
    if name not in MODELS:
        raise ModelFileError(f"{where}: the card's model {name!r} is not one of "
                             f"{sorted(MODELS)}")
    expected = card_model_shapes(name, schema, where)
    stored, size = read_header(path)
    if stored != expected:
        diff = [f"{k}: the file's {list(stored[k]) if k in stored else 'none'}, the model's "
                f"{list(expected[k]) if k in expected else 'none'}"
                for k in sorted(set(stored) | set(expected)) if stored.get(k) != expected.get(k)]
        raise ModelFileError(f"{path}: the weights do not fit the card's model {name!r} "
                             f"({'; '.join(diff[:3])[:300]}); refused, nothing built")
    try:
        digest = sha256_of(path)
    except OSError as err:
        raise ModelFileError(f"{path}: cannot be read ({err})") from None
    if digest != card.get("sha256"):
        raise ModelFileError(f"{path}: its sha256 {digest[:16]}... is not the card's "
                             f"{str(card.get('sha256'))[:16]}...: the file was changed or is not "
                             "the one the card describes; refused")
    try:
        with open(path, "rb") as f:
            data = f.read(size + 1)  # the size its header gives, checked above
    except OSError as err:
        raise ModelFileError(f"{path}: cannot be read ({err})") from None
    if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
        raise ModelFileError(f"{path}: the file changed while it was read; refused")
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
