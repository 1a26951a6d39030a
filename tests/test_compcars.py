"""CompCars (tasks/compcars.py) on a small image tree the test writes in the dataset's own
layout: 30 (viewpoint, year) clients, the four types as labels, the graph, the refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tasks.compcars import (
    CLASS_NAMES,
    CompCarsError,
    clients,
    compcars_graph,
    load_compcars,
    read_label,
)

#: model id -> CompCars type (1 MPV, 2 SUV, 3 hatchback, 4 sedan; 10: sports, left out)
MODELS = {"101": 1, "102": 2, "103": 3, "104": 4, "105": 10}


def _tree(root: Path, per_client: int = 3) -> Path:
    """CompCars' data folder: image/, label/ and misc/attributes.txt, ``per_client`` images of
    every (viewpoint, year), plus images it must leave out."""
    (root / "misc").mkdir(parents=True)
    (root / "misc" / "attributes.txt").write_text(
        "model_id maximum_speed displacement door_number seat_number type\n" +
        "".join(f"{m} 200 2.0 4 5 {t}\n" for m, t in MODELS.items()))
    rng = np.random.default_rng(0)
    count = 0

    def add(model: str, year: int, view: int) -> None:
        nonlocal count
        count += 1
        for kind in ("image", "label"):
            (root / kind / "7" / model / str(year)).mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 255, size=(40, 60, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / "image" / "7" / model / str(year) / f"{count}.jpg")
        (root / "label" / "7" / model / str(year) / f"{count}.txt").write_text(
            f"{view}\n1\n5 4 50 36\n")

    for i, (view, year) in enumerate(clients()):
        for k in range(per_client):
            add(list(MODELS)[(i + k) % 4], year, view)
    add("105", 2012, 1)   # a sports car: not one of the four types
    add("101", 2008, 1)   # another year
    add("101", 2012, -1)  # an uncertain viewpoint
    return root


def test_thirty_clients_of_viewpoint_and_year_with_the_four_types(tmp_path):
    data = load_compcars(_tree(tmp_path / "data"), seed=0)
    assert data.num_clients == 30 and data.names[:2] == ["front-2009", "front-2010"]
    assert data.names[-1] == "rear-2014"
    sizes = [len(data.train[i].y) + len(data.test[i].y) for i in range(30)]
    assert sizes == [3] * 30  # the three left-out images are in no client
    assert data.train[0].x.shape[1:] == (3, 32, 32) and 0 <= data.train[0].x.min()
    assert data.train[0].x.max() <= 1
    labels = np.concatenate([d.y for d in data.train + data.test])
    assert set(labels.tolist()) == {0, 1, 2, 3} and len(CLASS_NAMES) == 4


def test_the_graph_links_same_or_adjacent_viewpoints_or_years():
    graph = compcars_graph()
    names = {c: i for i, c in enumerate(clients())}
    front, front_side, rear = 1, 4, 2
    assert graph[names[(front, 2009)], names[(front_side, 2014)]] == 1  # adjacent viewpoints
    assert graph[names[(front, 2009)], names[(rear, 2010)]] == 1  # adjacent years
    assert graph[names[(front, 2009)], names[(rear, 2012)]] == 0  # neither
    assert graph.trace() == 0 and (graph == graph.T).all()


def test_a_folder_that_is_not_compcars_is_refused_naming_the_key(tmp_path):
    with pytest.raises(FileNotFoundError, match="'data-dir'.*image/, label/ and misc"):
        load_compcars(tmp_path)
    root = _tree(tmp_path / "data", per_client=1)
    with pytest.raises(CompCarsError, match="client front-2009 has 1 image"):
        load_compcars(root)
    (tmp_path / "bad.txt").write_text("front\n1\n")
    with pytest.raises(CompCarsError, match="viewpoint on line 1"):
        read_label(tmp_path / "bad.txt")


def test_a_folder_of_more_images_than_compcars_holds_stops_as_it_is_read(tmp_path, monkeypatch):
    import tasks.compcars as compcars

    root = _tree(tmp_path / "data")
    monkeypatch.setattr(compcars, "MOST_IMAGES", 40)
    with pytest.raises(CompCarsError, match="more than 40 images of the 30 clients"):
        load_compcars(root)
    (root / "misc" / "attributes.txt").write_text("1 2 3 4 5 6\n" * 200_000)
    with pytest.raises(CompCarsError, match="attributes.txt: more than"):
        load_compcars(root)
