"""The report (experiments/report.py, scores.py, tables.py, plots.py) on fake but consistent
metrics.json dicts, read through its one schema (``RunRecord``).

Expected table cells are computed by hand with the population std (numpy's
default, ddof=0): BMTA 80 and 90 -> "85.00 ± 5.00", 70 and 72 -> "71.00 ± 1.00".
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import matplotlib.image as mpimg
import pytest

from experiments import report, scores, tables
from experiments.scores import RunRecord
from strategies.core.records import RunFile

from .helpers import fake_run


def fake_grid() -> list[dict]:
    """2 strategies x 2 seeds on fmnist, one seed each with drop 0.3, plus FL-60 regression."""
    return [
        fake_run("fedamp", 1, 80.0, xi=True),
        fake_run("fedamp", 2, 90.0, xi=True, failed_eval_round=3),
        fake_run("fedavg", 1, 70.0),
        fake_run("fedavg", 2, 72.0),
        fake_run("fedamp", 1, 60.0, drop=0.3),
        fake_run("fedavg", 1, 65.0, drop=0.3),
        fake_run("fedamp", 1, 0.1234567, dataset="fl60", regression=True),
        fake_run("fedavg", 1, 0.2, dataset="fl60", regression=True),
    ]


def read_table(path: Path) -> tuple[list[str], dict[str, dict[str, str]]]:
    """Text lines before the first table, and its cells: method -> column header -> cell."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| Method"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    cells = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        row = [c.strip() for c in line.strip("|").split("|")]
        cells[row[0]] = dict(zip(header[1:], row[1:]))
    return lines[:start], cells


def test_write_report(tmp_path: Path) -> None:
    runs = fake_grid()
    written = report.write_report([RunRecord.from_json(r) for r in runs], tmp_path,
                                  strategy_order=["fedavg", "fedamp"])
    names = {p.name for p in written}
    assert all(p.parent == tmp_path and p.is_file() for p in written)
    assert names == {"results.csv", "table.md", "convergence.png", "client_accuracy.png",
                     "xi_fmnist_practical_drop_0_fedamp.png", "vs_drop-rate.png"}

    # results.csv: one row per run, its bmta / best MSE, the scenario and config columns
    with (tmp_path / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(runs)
    by_name = {r["run_name"]: r for r in rows}
    for run in runs:
        row = by_name[run["run_name"]]
        if "bmta" in run:
            assert float(row["bmta"]) == run["bmta"] and row["best_mean_mse"] == ""
        else:
            assert float(row["best_mean_mse"]) == run["best_mean_mse"] and row["bmta"] == ""
        assert float(row["drop-rate"]) == run["config"]["drop-rate"]
        assert row["config.local-epochs"] == "5" and row["novel_bmta"] == ""
    assert float(by_name["fedamp-fmnist-practical-1-d0.0"]["final_mean"]) == 75.0  # last round
    assert float(by_name["fedamp-fmnist-practical-2-d0.0"]["final_mean"]) == 90.0  # round 3 failed
    assert list(rows[0])[:6] == ["run_name", "strategy", "dataset", "partitioning", "seed",
                                 "num_clients"]

    # table.md: mean ± std (population) over seeds, best per column bold, "–" if missing
    intro, cells = read_table(tmp_path / "table.md")
    assert list(cells) == ["fedavg", "fedamp"]
    assert "BMTA" in intro[0] and "MSE" in intro[0] and "1–2 seed" in intro[0]
    assert cells["fedamp"]["fmnist/practical, drop 0"] == "**85.00 ± 5.00**"
    assert cells["fedavg"]["fmnist/practical, drop 0"] == "71.00 ± 1.00"
    assert cells["fedamp"]["fmnist/practical, drop 0.3"] == "60.00"
    assert cells["fedavg"]["fmnist/practical, drop 0.3"] == "**65.00**"
    assert cells["fedamp"]["fl60/practical (MSE)"] == "**0.1235**"   # lower MSE is better
    assert cells["fedavg"]["fl60/practical (MSE)"] == "0.2"
    assert "Novel clients" not in (tmp_path / "table.md").read_text()

    for path in written:
        if path.suffix == ".png":
            image = mpimg.imread(path)
            assert image.shape[0] > 10 and image.shape[1] > 10, path

    # one drop value only: no vs_drop-rate.png, no scenario suffix, a missing cell
    only = [r for r in runs if r["config"]["drop-rate"] == 0.0]
    out = tmp_path / "single"
    names = {p.name for p in report.write_report([RunRecord.from_json(r) for r in only[:-1]],
                                                 out)}
    assert "vs_drop-rate.png" not in names and not (out / "vs_drop-rate.png").exists()
    assert "xi_fmnist_practical_fedamp.png" in names
    _, cells = read_table(out / "table.md")
    assert list(cells) == ["fedamp", "fedavg"]          # first appearance
    assert cells["fedamp"]["fmnist/practical"] == "**85.00 ± 5.00**"
    assert cells["fedavg"]["fl60/practical (MSE)"] == "–"
    assert cells["fedamp"]["fl60/practical (MSE)"] == "**0.1235**"


def test_novel_table_and_load_runs(tmp_path: Path) -> None:
    runs = [fake_run("fedamp", s, b) for s, b in ((1, 80.0), (2, 84.0))]
    for run, novel in zip(runs, (50.0, 60.0)):
        run["config"]["novel-client-fraction"] = 0.25
        run["novel_clients"] = [3]
        run["novel_bmta"] = novel
    for i, run in enumerate(runs):
        (tmp_path / f"r{i}").mkdir()
        (tmp_path / f"r{i}" / "metrics.json").write_text(json.dumps(run))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "metrics.json").write_text("{not json")
    loaded = report.load_runs([tmp_path])
    assert [r.seed for r in loaded] == [1, 2]
    assert scores.data_setting_of(loaded[0]) == "fmnist/practical, novel 0.25"
    # client 3 is novel: left out of the per-client values at the best round (round 2)
    assert scores.best_round_clients(loaded[0]).tolist() == pytest.approx([78.0, 79.0, 81.0])

    tables.write_table(loaded, tmp_path / "table.md")
    text = (tmp_path / "table.md").read_text()
    main, novel = text.split("## Novel clients")
    assert "| fedamp | **82.00 ± 2.00** |" in main and "2 seed" in main
    assert "| fedamp | **55.00 ± 5.00** |" in novel and "novel clients" in novel


def test_csv_cells_carry_no_float_noise(tmp_path: Path) -> None:
    """A float such as 69.80000000000001 (a mean of percentages) is written as 69.8."""
    run = fake_run("fedamp", 0, 69.8)
    run["bmta"] = 69.80000000000001
    tables.write_csv([RunRecord.from_json(run)], tmp_path / "results.csv")
    text = (tmp_path / "results.csv").read_text()
    assert ",69.8," in text and "69.80000000000001" not in text


def test_horizon_share_gap_and_plots(tmp_path: Path, capsys) -> None:
    """experiments/horizon.py: the own-group share worked by hand, and its outputs."""
    import numpy as np

    from experiments import horizon

    run = RunRecord(RunFile(dataset="fmnist"), partitioning="practical")
    groups = np.repeat(np.arange(5), 4)  # 20 clients, 4 per group
    xi = np.where(groups[:, None] == groups[None, :], 0.25, 0.0)
    assert horizon.own_group_share(run, xi, list(range(20))) == pytest.approx(0.75)
    for strategy, best in (("separate", 80.0), ("fedamp", 90.0)):
        folder = tmp_path / "runs" / strategy
        folder.mkdir(parents=True)
        (folder / "metrics.json").write_text(json.dumps(fake_run(strategy, 0, best,
                                                                 xi=strategy == "fedamp")))
    horizon.main([str(tmp_path / "runs"), "-o", str(tmp_path / "out")])
    names = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"convergence.png", "gap.png", "xi_fedamp_round1.png", "xi_fedamp_round3.png"} <= names
    rows = {line.split("|")[1].strip(): line for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and "BMTA" not in line}
    assert "| 90.00 |" in rows["fedamp"] and "| 80.00 |" in rows["separate"]


def test_the_task_kind_comes_from_metrics_json_else_from_its_keys() -> None:
    regression = fake_run("fedavg", 0, 0.5, regression=True)
    assert RunRecord.from_json(regression).kind == "regression"
    assert RunRecord.from_json(fake_run("fedavg", 0, 50.0)).kind == "classification"
    # the ServerApp names the kind: it wins over what the keys suggest
    assert RunRecord.from_json({**regression, "task_kind": "classification"}).kind ==\
        "classification"


def _write_runs(folder: Path, runs: list[dict]) -> Path:
    for run in runs:
        (folder / run["run_name"]).mkdir(parents=True)
        (folder / run["run_name"] / "metrics.json").write_text(json.dumps(run))
    return folder


def test_a_grid_reported_in_pieces_keeps_the_earlier_runs(tmp_path: Path) -> None:
    """``report --add``: an earlier results.csv's runs that the paths do not hold (their
    folders gone) stay in it as they were, and the table and the convergence plot (the kept
    runs' rounds from a round digest) are those of all runs reported at once; without
    ``--add`` the command refuses, writing nothing; a run in both is reported anew."""
    runs = fake_grid()
    first = _write_runs(tmp_path / "first", runs[:4])
    second = _write_runs(tmp_path / "second", runs[4:])
    out, together = tmp_path / "out", tmp_path / "together"
    report.main([str(first), "-o", str(out)])
    before = {f: (out / f).read_bytes() for f in ("results.csv", "table.md")}
    clients = (out / "client_accuracy.png").read_bytes()
    with pytest.raises(SystemExit, match="holds 4 run"):
        report.main([str(second), "-o", str(out)])
    assert {f: (out / f).read_bytes() for f in before} == before
    digest = {r["run_name"]: {"strategy": r["strategy"], "bmta": r["bmta"],
                              "rounds_s_unpaused": 1.0, "paused_rounds": 0,
                              "rounds": [{"round": x["round"],
                                          "mean_accuracy": x.get("mean_accuracy")}
                                         for x in r["rounds"]]} for r in runs[:4]}
    (tmp_path / "rounds.json").write_text(json.dumps(digest))
    report.main([str(second), "-o", str(out), "--add", "--digest", str(tmp_path / "rounds.json")])
    report.main([str(first), str(second), "-o", str(together)])
    assert (out / "table.md").read_text() == (together / "table.md").read_text()
    # a kept run has no client's numbers: the first piece's plot of its clients is left as it was
    assert (out / "client_accuracy.png").read_bytes() == clients
    assert (mpimg.imread(out / "convergence.png")
            == mpimg.imread(together / "convergence.png")).all()
    earlier = before["results.csv"].decode().splitlines()
    now = (out / "results.csv").read_text().splitlines()
    assert now[:len(earlier)] == earlier and len(now) == len(runs) + 1  # kept as they were

    # a run in both: the new one's row, once; a results.csv that is not one is refused
    runs[0]["bmta"] = 99.0
    _write_runs(tmp_path / "third", runs[:1])
    report.main([str(tmp_path / "third"), "-o", str(out), "--add"])
    rows = tables.read_csv(out / "results.csv")
    assert [r["bmta"] for r in rows if r["run_name"] == runs[0]["run_name"]] == ["99.0"]
    assert len(rows) == len(runs)
    with pytest.raises(SystemExit):
        report.main([str(second), "-o", str(out), "--digest", str(tmp_path / "rounds.json")])


def test_a_report_refuses_what_it_cannot_keep_and_replaces_nothing(tmp_path: Path) -> None:
    """An earlier results.csv or round digest that cannot be read back (a column twice, a
    count that is not a whole number, a round that is not one) is refused with its reason
    before anything is replaced; one the report wrote itself, a run named twice among them,
    is read back."""
    run = fake_run("fedavg", 1, 70.0)
    twice = [_write_runs(tmp_path / f"p{i}", [run]) for i in (1, 2)]
    out = tmp_path / "out"
    report.main([*map(str, twice), "-o", str(out)])
    report.main([*map(str, twice), "-o", str(out)])  # its own file, the run named twice in it
    assert len(tables.read_csv(out / "results.csv")) == 2
    new = _write_runs(tmp_path / "new", [fake_run("fedamp", 1, 80.0)])
    text = (out / "results.csv").read_text()
    bad = {r"column\(s\) twice": text.replace("run_name,strategy", "run_name,run_name", 1),
           "not a whole number": text.replace(",3,", ",abc,").replace(",3\r", ",abc\r"),
           "another width": text + "x,y\r\n",
           "nested": text.replace(",5,", ',"' + "[" * 100_000 + '",', 1)}
    for reason, file in bad.items():
        (out / "results.csv").write_text(file)
        before = {f.name: f.read_bytes() for f in out.iterdir()}
        if reason == "nested":  # read back as text, not a crash
            report.main([str(new), "-o", str(out), "--add"])
            continue
        with pytest.raises(SystemExit, match=reason):
            report.main([str(new), "-o", str(out), "--add"])
        assert {f.name: f.read_bytes() for f in out.iterdir()} == before, reason
    digest = {run["run_name"]: {"bmta": 70.0, "rounds_s_unpaused": 1.0, "paused_rounds": 0,
                                "rounds": [{"round": "x", "mean_accuracy": 0.7}]}}
    (tmp_path / "rounds.json").write_text(json.dumps(digest))
    with pytest.raises(SystemExit, match="not a round digest"):
        report.main([str(new), "-o", str(out), "--add", "--digest", str(tmp_path / "rounds.json")])


def test_a_results_row_reads_back_as_its_run(tmp_path: Path) -> None:
    """:meth:`RunRecord.from_row` reads a row as :func:`tables.write_csv` wrote it: the
    config's types (bools, numbers, lists, text), the headline, who ran what."""
    run = RunRecord.from_json(fake_run("fedavg", 2, 0.25, dataset="fl60", regression=True))
    run.config.update({"tensorboard": False, "graph-file": "", "member-roster": [1, "a"]})
    tables.write_csv([run], tmp_path / "results.csv")
    back = RunRecord.from_row(tables.read_csv(tmp_path / "results.csv")[0])
    defaults = {k: d for k, (_, d) in scores.SCENARIOS.items() if k not in run.config}
    assert back.config == {**run.config, "graph-file": None, **defaults}
    assert (back.strategy, back.dataset, back.seed, back.num_clients, back.kind) == (
        run.strategy, run.dataset, run.seed, run.num_clients, run.kind)
    assert scores.score(back) == 0.25 and back.finished and scores.complete(back)


def test_the_runner_keeps_an_earlier_report_or_sets_it_aside(tmp_path: Path, capsys) -> None:
    """:func:`report.keep_earlier` (the experiment runner's report): the rows of runs the grid
    does not plan; an earlier results.csv that cannot be read back is set aside, never lost."""
    runs = [RunRecord.from_json(r) for r in fake_grid()[:2]]
    tables.write_csv(runs, tmp_path / "results.csv")
    kept = report.keep_earlier(tmp_path, {runs[0].run_name})
    assert [r["run_name"] for r in kept] == [runs[1].run_name]
    text = (tmp_path / "results.csv").read_text()
    (tmp_path / "results.csv").write_text(text.replace(",3,", ",three,"))  # rounds: not whole
    assert report.keep_earlier(tmp_path, set()) == []
    assert "set aside" in capsys.readouterr().out and not (tmp_path / "results.csv").exists()
    assert (tmp_path / "results.csv.unreadable").read_text() == text.replace(",3,", ",three,")


def test_a_column_over_different_seeds_names_them_and_bolds_within_a_seed_set(
        tmp_path: Path) -> None:
    """Three methods over seeds 0-2, two over seed 0 alone, one over seeds 0 and 2 (MSE).

    By hand: sfl (2, 1.5, 1.7) -> mean 1.733, std 0.2055; fedavg (2.4, 1.9, 1.9) -> 2.067,
    0.2357; separate (2.6, 2.0, 2.1) -> 2.233, 0.2625. Over all three seeds sfl is best.
    Seed 0 alone: per-fedavg 2.3 beats pfedme 19.5, but it is not bolder than sfl's 1.733,
    and seed 0 alone ranks separate (2.6) under per-fedavg (2.3) though its three-seed mean
    (2.233) reads better: so each seed set gets its own bold. pfedhn (seeds 0, 2) is alone
    in its set: named, not bold.
    """
    values = {"sfl": (2.0, 1.5, 1.7), "fedavg": (2.4, 1.9, 1.9), "separate": (2.6, 2.0, 2.1),
              "per-fedavg": (2.3,), "pfedme": (19.5,)}
    runs = [fake_run(m, seed, v, dataset="fl60", regression=True)
            for m, vs in values.items() for seed, v in enumerate(vs)]
    runs += [fake_run("pfedhn", seed, v, dataset="fl60", regression=True)
             for seed, v in ((0, 17.0), (2, 16.0))]
    tables.write_table([RunRecord.from_json(r) for r in runs], tmp_path / "table.md")
    intro, cells = read_table(tmp_path / "table.md")
    column = {m: c["fl60/practical (MSE)"] for m, c in cells.items()}
    assert column == {"sfl": "**1.733 ± 0.2055** (seeds 0–2)",
                      "fedavg": "2.067 ± 0.2357 (seeds 0–2)",
                      "separate": "2.233 ± 0.2625 (seeds 0–2)",
                      "per-fedavg": "**2.3** (seed 0)", "pfedme": "19.5 (seed 0)",
                      "pfedhn": "16.5 ± 0.5 (seeds 0, 2)"}
    assert "1–3 seed(s)" in intro[0] and "compare within a seed set" in intro[0]

    # the same seeds everywhere: no names, one bold, no caveat
    same = [r for r in runs if r["strategy"] in ("sfl", "fedavg", "separate")]
    tables.write_table([RunRecord.from_json(r) for r in same], tmp_path / "same.md")
    intro, cells = read_table(tmp_path / "same.md")
    assert cells["sfl"]["fl60/practical (MSE)"] == "**1.733 ± 0.2055**"
    assert cells["fedavg"]["fl60/practical (MSE)"] == "2.067 ± 0.2357"
    assert "seed set" not in intro[0]


def test_seed_label() -> None:
    assert tables.seed_label([0]) == "seed 0"
    assert tables.seed_label([2, 0, 1]) == "seeds 0–2"
    assert tables.seed_label([0, 2]) == "seeds 0, 2"
    assert tables.seed_label({None}) == "seed ?"
    assert tables.seed_label({1, None, 0}) == "seeds 0, 1, ?"
    assert tables.seed_label(s for s in (2, 3)) == "seeds 2–3"  # read once
