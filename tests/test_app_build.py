"""The app's files that ``flwr run`` submits, built once (experiments/flower_cli.py
``build_app``): the same FAB as Flower builds from the checkout, found without walking the
folders Flower's rules leave out whole. ``flwr build`` is Flower's CLI alone: no SuperLink,
no SuperNode, so these tests are not ``flower`` ones."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from experiments import flower_cli
from experiments.flower_cli import FlowerCliError, build_app, fab_candidates

from .helpers import FLWR, ROOT, app_files


def _app(root: Path, gitignore: str) -> Path:
    """A small app's folder: what Flower keeps, what it excludes by its own rules and by the
    app's .gitignore, a link, and a virtual environment's worth of files."""
    for rel in ("pyproject.toml", "app/main.py", "app/sub/notes.md", "data/keep.py",
                "data/deep/x.py", ".venv/lib/site.py", "app/__pycache__/main.py",
                "README.txt", "results/run/metrics.json"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x = 1\n")
    (root / ".gitignore").write_text(gitignore)
    os.symlink(root / "app" / "main.py", root / "app" / "link.py")
    return root


def test_the_candidates_are_what_flower_may_keep_without_entering_excluded_folders(
        tmp_path, monkeypatch):
    entered = []
    walk = os.walk

    def spy(top, *args, **kwargs):
        for dirpath, dirnames, filenames in walk(top, *args, **kwargs):
            entered.append(Path(dirpath).relative_to(top).as_posix())
            yield dirpath, dirnames, filenames

    monkeypatch.setattr(flower_cli.os, "walk", spy)
    app = _app(tmp_path / "app", "# comment\nresults/\ndata/deep/\n")
    found = fab_candidates(app)
    # Flower's publish rules keep .py/.toml/.md/.json and the root .gitignore; no link, no
    # .venv, __pycache__ or .gitignore'd folder (results/, data/deep/), nor a .txt file
    assert sorted(found or []) == [".gitignore", "app/main.py", "app/sub/notes.md",
                                   "data/keep.py", "pyproject.toml"]
    assert sorted(entered) == [".", "app", "app/sub", "data"]  # the excluded ones not walked
    # a negated pattern could take back a file of an excluded folder: Flower walks it all
    (app / ".gitignore").write_text("results/\n!results/run/metrics.json\n")
    assert fab_candidates(app) is None


@pytest.mark.slow
def test_the_apps_files_built_once_send_the_same_fab_as_the_checkout(tmp_path):
    """What every test's `flwr run` and a grid's runs submit (``build_app``: the FAB's files
    unpacked) builds the FAB of the checkout, to its hash, and so does a small app with
    folders its .gitignore excludes, built from the candidates or walked whole (a negated
    pattern); an app that Flower cannot build is one error with Flower's words."""
    def fab(app: Path, name: str) -> str:
        (tmp_path / name).mkdir()
        subprocess.run([FLWR, "build", "--app", str(app)], cwd=tmp_path / name, check=True,
                       capture_output=True, timeout=300)
        (built,) = [p.name for p in (tmp_path / name).glob("*.fab")]
        return built  # the name ends with the FAB's hash

    snapshot = app_files()  # build_app of the checkout, once for the test process
    assert (snapshot / "pyproject.toml").is_file() and not (snapshot / ".build").exists()
    assert not (snapshot / ".venv").exists() and (snapshot / "fedamp_flwr" / "client_app.py").is_file()
    assert fab(ROOT, "checkout") == fab(snapshot, "snapshot")

    small = _app(tmp_path / "small", "results/\ndata/deep/\n")
    (small / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    for gitignore, name in (("results/\ndata/deep/\n", "pruned"),
                            ("results/\n!results/run/metrics.json\n", "whole")):
        (small / ".gitignore").write_text(gitignore)
        built = build_app(small, tmp_path / f"{name}-app", FLWR)
        assert fab(small, f"{name}-direct") == fab(built, f"{name}-built")

    (tmp_path / "not-an-app").mkdir()
    with pytest.raises(FlowerCliError,
                       match=r"flwr build --app \S*not-an-app failed: .*pyproject\.toml"):
        build_app(tmp_path / "not-an-app", tmp_path / "nothing", FLWR)
