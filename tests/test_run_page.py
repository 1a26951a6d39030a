"""One page per run (fedamp_flwr/server/run_page.py, ``fedamp-flwr report``): a FedAMP members run with
privacy and a Panacea run with an inferred graph, each page opened in headless Chromium with
the network cut (Playwright): the headline shown, every plot decoded, nothing fetched; a
member's page names no other member; what a run's files hold is shown, never run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from fedamp_flwr.tools.cli import main

from .helpers import member_sites, run_named

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed "
                                    "(.ci/run installs Debian's chromium)")


def _open(page_path: Path, shot: Path) -> dict:
    """The page in headless Chromium, every request but the page's own refused: what it
    shows (the headline's text, the images' sizes, the requests tried) and a screenshot."""
    from playwright.sync_api import sync_playwright

    tried: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})

            def refuse(route):
                tried.append(route.request.url)
                if route.request.url == page_path.as_uri():
                    return route.continue_()
                return route.abort()

            page.route("**/*", refuse)
            page.goto(page_path.as_uri(), wait_until="load")
            headline = page.inner_text("#headline")
            images = page.eval_on_selector_all(
                "img", "els => els.map(e => [e.complete, e.naturalWidth, e.naturalHeight])")
            page.locator("#headline").screenshot(path=str(shot.with_suffix(".headline.png")))
            page.screenshot(path=str(shot), full_page=True)
            text = page.inner_text("body")
        finally:
            browser.close()
    return {"headline": headline, "images": images, "tried": tried, "text": text}


def _pixels(path: Path) -> np.ndarray:
    import matplotlib.image

    return matplotlib.image.imread(path)


def _members_run(tmp_path: Path) -> Path:
    run_config, nodes = member_sites(tmp_path / "sites", "synthetic", 3)
    for i, node in enumerate(nodes):
        node["privacy-dir"] = str(tmp_path / f"ledger-{i}")
    nodes[2]["dp-max-epsilon"] = 19.0  # it stops after 2 of 4 rounds: absences
    run_named(tmp_path, "fedamp-members", {**run_config, "strategy": "fedamp",
                                           "local-epochs": 1, "num-server-rounds": 4,
                                           "dp": "update", "dp-noise-multiplier": 0.5}, 3, nodes)
    return tmp_path / "fedamp-members"


@pytest.mark.slow
@needs_chromium
def test_a_fedamp_members_run_and_a_members_page(tmp_path, capsys):
    folder = _members_run(tmp_path)
    metrics = json.loads((folder / "metrics.json").read_text())
    names = metrics["client_names"]
    assert main(["report", str(folder)]) == 0
    assert main(["report", str(folder), "--members"]) == 0
    seen = _open(folder / "report.html", tmp_path / "run.png")
    assert seen["headline"].startswith(f"BMTA {metrics['bmta']:.2f}%")
    assert f"over {metrics['coverage']['clients_in_best_round']} of 3 clients" in seen["headline"]
    assert "4 of 4 rounds, 1 local epoch(s) a round" in seen["headline"]
    # curves, absences, xi and epsilon: every plot decoded, nothing fetched but the page
    assert len(seen["images"]) == 4 and all(c and w > 200 and h > 100
                                            for c, w, h in seen["images"])
    assert seen["tried"] == [(folder / "report.html").as_uri()]
    assert all(n in seen["text"] for n in names) and "privacy budget" not in seen["text"]
    shot, headline = _pixels(tmp_path / "run.png"), _pixels(tmp_path / "run.headline.png")
    assert shot.shape[0] > 900 and shot.std() > 0.05  # a page, not a blank
    assert headline.shape[1] > 300 and headline.std() > 0.02  # the headline, drawn

    member = names[1]
    page = (folder / f"report-{member}.html").read_text()
    assert not any(other in page for other in names if other != member)
    # the run config it shows is how the run trained, none of the coordinator's paths
    assert "local-epochs" in page and "results-dir" not in page and str(tmp_path) not in page
    clients = page.split("<h2>Clients</h2>")[1].split("</table>")[0]
    assert clients.count("<tr>") == 2 and "3 clients" not in page  # its row; not the count
    assert (folder / f"report-{member}.html").stat().st_mode & 0o077 == 0  # private
    mine = _open(folder / f"report-{member}.html", tmp_path / "member.png")
    best = 100 * max(r["client_accuracy"][str(1)] for r in metrics["rounds"])
    assert mine["headline"].startswith(f"{member}: best test accuracy {best:.2f}%")
    assert len(mine["images"]) == 2 and all(c and w > 200 for c, w, _ in mine["images"])
    assert "This member was never absent." in mine["text"]
    assert mine["tried"] == [(folder / f"report-{member}.html").as_uri()]
    # the member that ran out of budget sees its own absences, by round, with why
    last = (folder / f"report-{names[2]}.html").read_text()
    assert "privacy budget" in last and names[0] not in last


@needs_chromium
def test_a_panacea_run_with_an_inferred_graph(tmp_path):
    run_named(tmp_path, "panacea", {"strategy": "panacea", "graph": "inferred", "graph-k": 2,
                                    "graph-warmup-rounds": 1, "graph-guard-rounds": 1,
                                    "local-steps": 3, "num-server-rounds": 3,
                                    "panacea-server-lr": 0.01}, 6)
    folder = tmp_path / "panacea"
    assert main(["report", str(folder), "--out", str(tmp_path / "page.html")]) == 0
    seen = _open(tmp_path / "page.html", tmp_path / "panacea.png")
    assert seen["headline"].startswith("BMTA ")
    assert "The inferred client graph" in (tmp_path / "page.html").read_text()
    assert "No client was absent in any round." in seen["text"]
    assert "in the guard (decided in round 2)" in seen["text"]
    # the curves, the graph and the guard's held-out errors
    assert len(seen["images"]) == 3 and all(c and w > 200 for c, w, _ in seen["images"])


def test_the_guards_choice_and_a_switch_back_are_on_the_page(tmp_path):
    """The coordinator's page says when the inferred graph took over and when the run went
    back to pFedHN, and draws both arms' held-out errors; a member's page says it alone."""
    folder = tmp_path / "run"
    folder.mkdir()
    rounds = [{"round": k, "clients": 4, "inferred graph": 0.3, "no graph": 0.4} for k in (3, 4)]
    rounds += [{"round": k, "clients": 4, "inferred graph": e, "no graph": 0.3, "stage": "watch"}
               for k, e in ((5, 0.2), (6, 0.5), (7, 0.6))]
    record = {"run_name": "r", "strategy": "panacea", "dataset": "x", "num_clients": 2,
              "client_names": ["site-a", "site-b"], "graph_guard": {
                  "round": 4, "chosen": "inferred graph", "rounds": rounds,
                  "switched_back": {"round": 7, "why": "fell behind"}},
              "rounds": [{"round": 1, "client_accuracy": {"0": 0.5, "1": 0.25}}]}
    (folder / "metrics.json").write_text(json.dumps(record))
    assert main(["report", str(folder)]) == 0 and main(["report", str(folder), "--members"]) == 0
    page = (folder / "report.html").read_text()
    assert "took over the run; in round 7 it fell behind pFedHN" in page
    assert page.count("<img") == 2 and "held-out errors" in page  # the curves, the guard's
    member = (folder / "report-site-a.html").read_text()
    assert "in round 7 it fell behind pFedHN" in member and "held-out errors" not in member
    # kept: the sentence without a switch; refused: a record that is no guard's
    for guard, said in (({"round": 4, "chosen": "inferred graph"}, "stayed ahead of pFedHN"),
                        ({"round": 4, "chosen": "inferred graph", "switched_back": {
                            "round": 6, "why": "the run diverged"}}, "in round 6 it diverged"),
                        ({"round": 4, "chosen": "inferred graph", "watch_ended": {"round": 5}},
                         "in round 5 the pFedHN path watched beside it diverged"),
                        ({"round": 3, "chosen": "no graph", "diverged": ["inferred graph"]},
                         "A hypernetwork of the guard diverged in round 3"),
                        ({"round": 4, "chosen": "no graph"}, "the run was pFedHN throughout"),
                        ({"round": True, "chosen": "no graph"}, None),
                        ({"round": 4, "chosen": "<b>"}, None), ("x", None)):
        (folder / "metrics.json").write_text(json.dumps({**record, "graph_guard": guard}))
        assert main(["report", str(folder)]) == 0
        page = (folder / "report.html").read_text()
        assert (said in page) if said else "guard</h2>" not in page


def test_a_runs_strings_are_shown_never_run_and_bad_arguments_are_one_line(tmp_path, capsys):
    folder = tmp_path / "run"
    folder.mkdir()
    evil = '<script>alert(1)</script><img src="http://example.com/x">'
    (folder / "metrics.json").write_text(json.dumps({
        "run_name": evil, "strategy": "fedavg", "dataset": "synthetic", "num_clients": 2,
        "client_names": ["a", evil[:20]], "config": {"label": evil},
        "rounds": [{"round": 1, "client_accuracy": {"0": 0.5, "1": 0.25}, "mean_accuracy": 0.375,
                    "absent_clients": {"1": evil}}], "bmta": 37.5}))
    assert main(["report", str(folder)]) == 0
    page = (folder / "report.html").read_text()
    assert "<script>" not in page and 'src="http' not in page and "&lt;script&gt;" in page
    assert main(["report", str(folder), "--member", "nobody"]) == 2
    assert "--member 'nobody': run" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "its metrics.json cannot be read" in capsys.readouterr().err


def test_a_damaged_or_hostile_run_file_is_drawn_or_refused_in_one_line(tmp_path, capsys):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "metrics.json").write_text(json.dumps({
        "run_name": "r", "strategy": "fedavg", "dataset": "x", "num_clients": 10**12,
        "client_names": ["$x^{$", "a", "a", "", "../evil", "site-ok"],
        "rounds": [{"round": "x"}, {"round": 2, "client_accuracy": [1, 2]},
                   {"round": 1, "client_accuracy": {"5": 0.5, "x": 1, "1": "s", "2": None},
                    "absent_clients": {"5": "boom", "zz": 1}, "client_dp_epsilon": [1]},
                   {"client_accuracy": {"0": 1}}, "not a round",
                   {"round": 3, "client_accuracy": {"0": 10**400}}],
        "inferred_graph": {"edges": [[0, 1], [5, 99], "x"]}, "alone": {"5": [1, 2]},
        "graph_guard": {"round": 2, "chosen": "no graph", "rounds": [
            {"round": 1, "inferred graph": "x"}, {"round": 2, "inferred graph": float("nan"),
                                                  "no graph": 1}, 7,
            {"round": 3, "inferred graph": 10**400, "no graph": -5}]}}))
    assert main(["report", str(folder)]) == 0  # what can be read is drawn, the rest left out
    # names that are no member names, or that two clients hold, get no page
    assert main(["report", str(folder), "--members"]) == 0
    assert sorted(p.name for p in folder.glob("report-*")) == ["report-site-ok.html"]
    for bad in ("a", "$x^{$", "", "../evil"):
        assert main(["report", str(folder), "--member", bad]) == 2
    assert main(["report", str(folder), "--out", "/"]) == 2
    err = capsys.readouterr().err
    assert err.count("error: ") == 5 and "Traceback" not in err
    # a link planted where the page goes is replaced, never written through
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    (folder / "report.html").unlink()
    (folder / "report.html").symlink_to(victim)
    assert main(["report", str(folder)]) == 0
    assert victim.read_text() == "mine" and not (folder / "report.html").is_symlink()
