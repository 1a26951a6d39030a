"""CompCars as the Panacea paper uses it (the split of Xu et al. 2021, GRDA): 30 clients,
one per (viewpoint, year of manufacture), car type as the label.

From the user's CompCars ``data`` folder (``data-dir``), laid out as the dataset ships it
(Yang et al. 2015):

* ``image/<make>/<model>/<year>/<name>.jpg``: the whole-car images;
* ``label/<make>/<model>/<year>/<name>.txt``: line 1 the viewpoint (-1 uncertain, 1 front,
  2 rear, 3 side, 4 front-side, 5 rear-side), line 3 the car's box ``x1 y1 x2 y2``
  (1-based pixels);
* ``misc/attributes.txt``: one line per model, ``model_id maximum_speed displacement
  door_number seat_number type``.

Clients: the 5 viewpoints x the 6 years 2009-2014 (GRDA's), named ``<viewpoint>-<year>``;
an image of an uncertain viewpoint, another year or another type is left out. Labels: GRDA's
four car types, MPV (type 1), SUV (2), hatchback (3) and sedan (4), as classes 0-3. Two
clients are linked when their viewpoints are the same or adjacent (in the order front,
front-side, side, rear-side, rear) or their years are the same or adjacent. Each image is
cropped to its box, resized to 32 x 32 RGB and scaled to [0, 1]; each client's images are
split 80/20 at random (seeded). The model is the CNN of McMahan et al. with three input
channels (``cnn``), trained from scratch: GRDA's features come from a network pretrained
on ImageNet, which these machines cannot fetch (a deviation, docs/configuration.md).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .data import Split, missing_in
from .federated import FederatedData, split_80_20

#: viewpoint codes of the label files, in the order of adjacency
VIEWPOINTS = {1: "front", 4: "front-side", 3: "side", 5: "rear-side", 2: "rear"}
YEARS = tuple(range(2009, 2015))
#: CompCars' type ids -> classes (GRDA's four types)
TYPES = {1: 0, 2: 1, 3: 2, 4: 3}
CLASS_NAMES = ("MPV", "SUV", "hatchback", "sedan")
SIZE = 32
#: the most images a folder may give (CompCars' whole-car images: 136,726; 12 KB each once
#: scaled to 32 x 32 RGB floats, so at most 2.5 GB), checked as they are read; the most bytes
#: read of one label file (three short lines) or of misc/attributes.txt
MOST_IMAGES = 200_000
MOST_LABEL_BYTES = 4096
MOST_ATTRIBUTES_BYTES = 1 << 20


class CompCarsError(ValueError):
    """A CompCars folder or file that cannot be used, naming it."""


def clients() -> list[tuple[int, int]]:
    """The 30 (viewpoint code, year) clients, viewpoints in adjacency order."""
    return [(v, y) for v in VIEWPOINTS for y in YEARS]


def compcars_graph() -> np.ndarray:
    """The 30 clients' graph: linked when their viewpoints or their years are the same or
    adjacent (no self loops)."""
    order = {v: i for i, v in enumerate(VIEWPOINTS)}
    pairs = clients()
    view = np.array([order[v] for v, _ in pairs])
    year = np.array([y for _, y in pairs])
    near = (np.abs(view[:, None] - view[None, :]) <= 1) | (np.abs(year[:, None] - year[None, :])
                                                           <= 1)
    np.fill_diagonal(near, False)
    return near.astype(np.float32)


def read_types(path: Path) -> dict[str, int]:
    """Model id -> CompCars type id, from ``misc/attributes.txt``."""
    types: dict[str, int] = {}
    with open(path, errors="replace") as f:
        text = f.read(MOST_ATTRIBUTES_BYTES + 1)
    if len(text) > MOST_ATTRIBUTES_BYTES:
        raise CompCarsError(f"{path}: more than {MOST_ATTRIBUTES_BYTES} bytes; CompCars' is "
                            "about 40 KB")
    for line_no, line in enumerate(text.splitlines(), start=1):
        parts = line.split()
        if not parts or not parts[0].isdigit():  # the header
            continue
        if len(parts) != 6:
            raise CompCarsError(f"{path}:{line_no}: expected 6 columns (model_id ... type), "
                                f"got {len(parts)}")
        try:
            types[parts[0]] = int(float(parts[5]))
        except ValueError:
            raise CompCarsError(f"{path}:{line_no}: type {parts[5]!r} is not a number") from None
    return types


def read_label(path: Path) -> tuple[int, tuple[int, int, int, int]]:
    """The viewpoint code and the box ``(x1, y1, x2, y2)`` of one label file."""
    with open(path, errors="replace") as f:
        lines = f.read(MOST_LABEL_BYTES).split("\n")
    try:
        view = int(lines[0])
        x1, y1, x2, y2 = (int(float(v)) for v in lines[2].split()[:4])
    except (ValueError, IndexError):
        raise CompCarsError(f"{path}: expected the viewpoint on line 1 and the box "
                            "'x1 y1 x2 y2' on line 3") from None
    return view, (x1, y1, x2, y2)


def _image(path: Path, box: tuple[int, int, int, int]) -> np.ndarray:
    from PIL import Image  # only CompCars and members' image folders need it

    try:
        with Image.open(path) as opened:
            im = opened.convert("RGB")
    except (OSError, ValueError) as err:
        raise CompCarsError(f"{path}: not an image ({err})") from None
    left, top = max(box[0] - 1, 0), max(box[1] - 1, 0)
    right, bottom = min(box[2], im.width), min(box[3], im.height)
    if right > left and bottom > top:  # a box outside the image: the whole image
        im = im.crop((left, top, right, bottom))
    im = im.resize((SIZE, SIZE), Image.Resampling.BILINEAR)
    return np.asarray(im, dtype=np.float32).transpose(2, 0, 1) / 255.0


def load_compcars(folder: Path, seed: int = 0) -> FederatedData:
    """The 30 CompCars clients from the user's ``data`` folder (see the module)."""
    attributes = folder / "misc" / "attributes.txt"
    if not (folder / "image").is_dir() or not (folder / "label").is_dir() or \
            not attributes.is_file():
        raise missing_in(folder, "dataset 'compcars' needs CompCars' data folder: image/, label/ "
                                 "and misc/attributes.txt")
    types = read_types(attributes)
    index = {c: i for i, c in enumerate(clients())}
    xs: list[list[np.ndarray]] = [[] for _ in index]
    ys: list[list[int]] = [[] for _ in index]
    for label in sorted((folder / "label").glob("*/*/*/*.txt")):
        make, model, year, name = label.relative_to(folder / "label").with_suffix("").parts
        kind = TYPES.get(types.get(model, 0))
        if kind is None or not (year.isascii() and year.isdigit()):
            continue
        view, box = read_label(label)
        client = index.get((view, int(year)))
        image = folder / "image" / make / model / year / f"{name}.jpg"
        if client is None or not image.is_file():
            continue
        if sum(map(len, ys)) >= MOST_IMAGES:
            raise CompCarsError(f"{folder}: more than {MOST_IMAGES} images of the 30 clients; "
                                "CompCars has 136,726")
        xs[client].append(_image(image, box))
        ys[client].append(kind)
    rng = np.random.default_rng([40_017, seed])
    train, test = [], []
    names = [f"{VIEWPOINTS[v]}-{y}" for v, y in clients()]
    for i, name in enumerate(names):
        if len(ys[i]) < 2:
            raise CompCarsError(f"{folder}: client {name} has {len(ys[i])} image(s) of the four "
                                "types; needs at least 2")
        tr, te = split_80_20(Split(np.stack(xs[i]), np.array(ys[i], dtype=np.int64)), rng)
        train.append(tr)
        test.append(te)
    return FederatedData(train, test, compcars_graph(), names)
