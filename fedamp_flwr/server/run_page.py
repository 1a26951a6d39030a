"""One page per run: ``fedamp-flwr report RUN_DIR [--out FILE] [--member NAME]``.

A self-contained HTML page (``report.html`` in the run's folder by default), made from
the run's ``metrics.json`` and the files beside it: no script, no network (its plots are
inline PNGs, and its Content-Security-Policy lets it load nothing else). It shows:

* the headline: BMTA (best mean test accuracy) or the best mean test MSE, over whom
  (``coverage``: clients in the best round, of the benign ones) and at what budget
  (rounds, local epochs or steps), and the novel clients' where the run has them;
* each client's test curve with the mean, the absences by reason per round, FedAMP's
  weights xi (the last round written) or the inferred client graph, the inferred graph's
  guard (its choice, a switch back to pFedHN, the held-out errors), each member's epsilon;
* a table of the clients (best, last, rounds evaluated, absences, epsilon, alone), and the
  run config.

``--member NAME`` makes a member's page, for the coordinator to hand to that member: only
that member's row, curve, absences and epsilon, and no other client's name or numbers (no
mean, no weights or graph: they are made of the others' models). Every string of the run's
files is escaped: a name or a reason is shown, never run.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from strategies.core.protocol import is_name
from strategies.core.records import (
    ABSENT,
    DP_SPENT,
    METRICS,
    REJECTED,
    RunFile,
    Score,
    client_key,
    is_client_map,
    kept_said,
    mean_key,
    mean_score,
)
from strategies.core.settings import MOST_CLIENTS, MOST_ROUNDS
from tasks.files import atomic_write, strict_json

from ..config import ConfigError, redact_uri
from .results import load_xi

PAGE = "report.html"
#: the two arms a ``graph_guard`` record's rounds hold (strategies/graph_guard.py's names)
GUARD_ARMS = ("inferred graph", "no graph")
#: the most clients whose weights or graph a page draws, and whose curves it draws
MOST_DRAWN = 2000
MEANS = {mean_key(m, novel) for m in METRICS for novel in (False, True)}
#: the run config a member's page shows
MEMBER_KEYS = ("strategy", "dataset", "num-server-rounds", "local-epochs", "local-steps",
               "batch-size", "learning-rate", "optimizer", "seed", "dp", "dp-clip",
               "dp-noise-multiplier", "dp-delta", "save-models", "validation-fraction",
               "fraction-train")
_CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em;margin-bottom:.2em}.sub{color:#555;margin-top:0}
#headline{font-size:1.6em;background:#eef5ee;border-left:6px solid #2a7;padding:.5em 1em;
margin:1em 0}#headline small{display:block;font-size:.55em;color:#444}
img{max-width:100%;border:1px solid #ddd;margin:.5em 0}
table{border-collapse:collapse;font-size:.9em;margin:.5em 0}
td,th{border:1px solid #ccc;padding:.2em .6em;text-align:right}
td:first-child,th:first-child{text-align:left}
.note{color:#555;font-size:.9em}"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    for text in fig.findobj(lambda o: hasattr(o, "set_parse_math")):
        text.set_parse_math(False)  # a name's $...$ is text, never math
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _square(matrix: Any) -> bool:
    """A drawable matrix of weights: 2-D, square, real, at most :data:`MOST_DRAWN` a side."""
    m = np.asarray(matrix)
    return (m.ndim == 2 and m.shape[0] == m.shape[1] and 0 < m.shape[0] <= MOST_DRAWN
            and m.dtype.kind in "fiu")


def _client(key: Any) -> int | None:
    """A client id of a record's map (an int, or its digits as JSON writes it), or None."""
    if isinstance(key, int) and not isinstance(key, bool):
        value = key
    elif isinstance(key, str) and key.isdigit() and len(key) <= 6:
        value = int(key)
    else:
        return None
    return value if 0 <= value < MOST_CLIENTS else None


def _finite(value: Any) -> bool:
    """A number that is finite as a float (an integer too large for one is not)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _round_no(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MOST_ROUNDS


def clean_round(rec: Any) -> dict[str, Any] | None:
    """The parts of a round's record the page shows, of the types it draws (None: no round):
    an int ``round``; each map of clients with int ids and finite numbers (absences: their
    reasons as text); the means that are finite numbers. What a damaged or hand-edited file
    holds besides is left out, never raised."""
    k = rec.get("round") if isinstance(rec, dict) else None
    if not isinstance(k, int) or isinstance(k, bool) or not 0 < k <= MOST_ROUNDS:
        return None
    out: dict[str, Any] = {"round": k}
    texts = set(ABSENT.values()) | set(REJECTED.values())
    for key, value in rec.items():
        if key in texts and isinstance(value, dict):
            out[key] = {c: str(v)[:300] for c0, v in value.items()
                        if (c := _client(c0)) is not None}
        elif is_client_map(key) and isinstance(value, dict):
            out[key] = {c: float(v) for c0, v in value.items()
                        if (c := _client(c0)) is not None and _finite(v)}
        elif key in MEANS and _finite(value):
            out[key] = float(value)
    return out


def _whole_rounds(ax: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _img(fig: Any, alt: str) -> str:
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{_png(fig)}">'


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def guard_section(held: object, coordinator: bool) -> str:
    """A run's section on its inferred graph's guard (``held``: metrics.json's
    ``graph_guard``): when it was tried, whether it took over, and whether the run went back
    to pFedHN; the ``coordinator``'s page draws each guard and watch round's mean held-out
    errors (a member's: the sentence alone)."""
    if not isinstance(held, dict) or not _round_no(held.get("round")):
        return ""
    decided, chosen = held["round"], held.get("chosen")
    back, ended = held.get("switched_back"), held.get("watch_ended")
    diverged = isinstance(back, dict) and "diverged" in str(back.get("why", ""))
    back = back["round"] if isinstance(back, dict) and _round_no(back.get("round")) else None
    ended = ended["round"] if isinstance(ended, dict) and _round_no(ended.get("round")) \
        else None
    if chosen == GUARD_ARMS[0]:
        said = (f"The inferred graph beat no graph on the clients' held-out rows in the "
                f"guard (decided in round {decided}) and took over the run; " + (
                    f"in round {back} it {'diverged' if diverged else 'fell behind pFedHN'}"
                    ", and the run went back to pFedHN (trained on the side) to the end."
                    if back is not None else
                    f"in round {ended} the pFedHN path watched beside it diverged, and the "
                    "run went on with the graph, unwatched, to the end." if ended is not None
                    else "it stayed ahead of pFedHN, watched on the side, to the end."))
    elif chosen == GUARD_ARMS[1] and held.get("diverged"):
        said = (f"A hypernetwork of the guard diverged in round {decided}: the side was "
                "dropped, and the run was pFedHN throughout.")
    elif chosen == GUARD_ARMS[1]:
        said = (f"The inferred graph did not beat no graph on the clients' held-out rows "
                f"in the guard (decided in round {decided}): the run was pFedHN "
                "throughout.")
    else:
        return ""
    text = f'<h2>The inferred graph\'s guard</h2><p class="note">{_e(said)}</p>'
    rounds = held.get("rounds")
    if not coordinator or not isinstance(rounds, list):
        return text
    points = [r for r in rounds[:MOST_ROUNDS] if isinstance(r, dict) and _round_no(
        r.get("round")) and all(_finite(r.get(a)) and r[a] >= 0 for a in GUARD_ARMS)]
    if not points:
        return text
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 3.4))
    xs = [r["round"] for r in points]
    ax.plot(xs, [float(r[GUARD_ARMS[0]]) for r in points], "o-", label="inferred graph")
    ax.plot(xs, [float(r[GUARD_ARMS[1]]) for r in points], "s-",
            label="no graph (the watch: pFedHN)")
    ax.axvline(decided, color="grey", ls="--", lw=1, label=f"decided (round {decided})")
    if back is not None:
        ax.axvline(back, color="red", ls=":", lw=1.5, label=f"back to pFedHN (round {back})")
    ax.set(xlabel="round", ylabel="mean held-out error",
           title="The guard's and the watch's held-out errors")
    ax.grid(alpha=0.3)
    _whole_rounds(ax)
    ax.legend(fontsize="small")
    return text + _img(fig, "the guard's held-out errors")


class RunPage:
    """A run's page (:meth:`html`), or a member's (``member``: its name)."""

    def __init__(self, folder: Path, member: str | None = None) -> None:
        self.folder = folder
        try:
            self.run = RunFile.read(folder / "metrics.json")
        except (OSError, ValueError, RecursionError) as err:
            raise ConfigError(f"RUN_DIR = '{folder}': its metrics.json cannot be read "
                              f"({type(err).__name__}: {str(err)[:200]}); allowed: a run's "
                              "folder") from None
        # a name that is no member name (a forgotten member's "", a damaged file's) is none
        self.names = [n if is_name(n) else "" for n in (self.run.client_names or [])]
        self.member = member
        self.cid: int | None = None
        if member is not None:
            if not is_name(member) or self.names.count(member) != 1:
                raise ConfigError(f"--member {member[:80]!r}: run '{folder.name}' has no member "
                                  f"of that name ({len([n for n in self.names if n])} members)")
            self.cid = self.names.index(member)
        self.score: Score = self.run.score
        self.rounds = sorted((c for r in self.run.rounds if (c := clean_round(r)) is not None),
                             key=lambda r: r["round"])
        seen = max((c for r in self.rounds for c in r.get(client_key(self.score.metric), {})),
                   default=-1) + 1
        count = self.run.num_clients if isinstance(self.run.num_clients, int) else 0
        self.n = len(self.names) or max(seen, min(max(count, 0), MOST_CLIENTS))
        self._index()

    # --- numbers ---
    def name(self, cid: Any) -> str:
        i = int(cid)
        return self.names[i] if 0 <= i < len(self.names) and self.names[i] else f"client {i}"

    def clients(self) -> list[int]:
        """The clients the page shows: the member alone, or every one with a value."""
        if self.cid is not None:
            return [self.cid]
        return list(range(self.n))

    def curve(self, cid: int) -> tuple[list[int], list[float]]:
        xs, ys = [], []
        for r in self.rounds:
            values = r.get(client_key(self.score.metric)) or {}
            value = values.get(cid)
            if value is not None:
                xs.append(r["round"])
                ys.append(self.score.scale * float(value))
        return xs, ys

    def _index(self) -> None:
        """Each client's absences (round, phase, why) and epsilons (round, value), in one
        pass over the rounds."""
        self._absent: dict[int, list[tuple[int, str, str]]] = {}
        self._spent: dict[int, list[tuple[int, float]]] = {}
        for r in self.rounds:
            k = r["round"]
            for phase, key in ABSENT.items():
                for c, why in r.get(key, {}).items():
                    self._absent.setdefault(c, []).append((k, phase, why))
            for c, v in r.get(DP_SPENT, {}).items():
                self._spent.setdefault(c, []).append((k, v))

    def absences(self, cid: int | None = None) -> list[tuple[int, str, str]]:
        """(round, phase, reason) of every absence (``cid``: of that client only)."""
        if cid is not None:
            return self._absent.get(cid, [])
        return sorted(a for found in self._absent.values() for a in found)

    def epsilon(self, cid: int) -> float | None:
        return max((v for _, v in self._spent.get(cid, [])), default=None)

    # --- sections ---
    def headline(self) -> str:
        run, score = self.run, self.score
        what = "BMTA" if score.higher_is_better else "Best mean test MSE"
        unit = "%" if score.higher_is_better else ""
        number = ".2f" if score.higher_is_better else ".4g"
        config = run.config
        budget = (f"{run.completed_rounds} of {config.get('num-server-rounds', '?')} rounds, "
                  + (f"{config.get('local-steps')} local steps" if config.get("local-steps")
                     else f"{config.get('local-epochs', '?')} local epoch(s)") + " a round")
        if self.cid is not None:
            xs, ys = self.curve(self.cid)
            if not ys:
                return (f'<div id="headline">{_e(self.member)}: no test result in this run'
                        f"<small>{_e(budget)}</small></div>")
            top = score.best(ys)
            at = xs[ys.index(top)]
            alone = (run.alone or {}).get(str(self.cid))
            alone = alone if isinstance(alone, dict) else {}
            scores = {k: alone[k] for k in ("linear", "model") if _finite(alone.get(k))}
            alone_text = "; alone: " + ", ".join(
                f"{score.scale * float(v):.4g}{unit} ({_e(k)})" for k, v in scores.items()
            ) if scores else ""
            alone_text += _e(kept_said(alone))
            return (f'<div id="headline">{_e(self.member)}: best test {_e(score.metric)} '
                    f"{top:{number}}{unit} (round {at}), last {ys[-1]:{number}}{unit}"
                    f"<small>{_e(budget)}{alone_text}</small></div>")
        _, best = run.headline()
        cover = run.coverage or {}
        over = (f"over {cover.get('clients_in_best_round', '?')} of "
                f"{cover.get('benign_clients', '?')} clients (round {cover.get('best_round')})")
        value = f"{best:{number}}{unit}" if best is not None else "none (no round has a mean)"
        _, novel = run.headline(novel=True)
        extra = f"; novel clients: {novel:{number}}{unit}" if novel is not None else ""
        return (f'<div id="headline">{what} {value}<small>{_e(over)}, {_e(budget)}'
                f"{_e(extra)}</small></div>")

    def curves(self) -> str:
        plt = _plt()
        fig, ax = plt.subplots(figsize=(8, 4.2))
        clients = self.clients()
        for cid in clients[:MOST_DRAWN]:
            xs, ys = self.curve(cid)
            if xs:
                ax.plot(xs, ys, lw=2 if self.cid is not None else 0.8,
                        alpha=1.0 if self.cid is not None else 0.45,
                        label=self.name(cid) if len(clients) <= 12 else None)
        if self.cid is None:
            means = [(r["round"], self.score.scale * m) for r in self.rounds
                     if (m := mean_score(r, self.score)) is not None]
            if means:
                ax.plot(*zip(*means), color="black", lw=2.5, label="mean (benign clients)")
        label = "test accuracy (%)" if self.score.higher_is_better else "test MSE"
        ax.set(xlabel="round", ylabel=label, title="Each client's test curve"
               if self.cid is None else f"{self.member}'s test curve")
        if not self.score.higher_is_better:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        _whole_rounds(ax)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small", ncol=2)
        return _img(fig, "test curves")

    def absence_plot(self) -> str:
        found = self.absences(self.cid)
        if not found:
            said = ("This member was never absent." if self.cid is not None else
                    "No client was absent in any round.")
            return f'<p class="note">{said}</p>'
        if self.cid is not None:
            rows = "".join(f"<tr><td>{r}</td><td>{_e(p)}</td><td>{_e(w)}</td></tr>"
                           for r, p, w in found)
            return ("<table><tr><th>round</th><th>phase</th><th>why</th></tr>"
                    f"{rows}</table>")
        from .dashboards import reason_kind

        plt = _plt()
        tally = Counter((f"{p}: {reason_kind(w)}", r) for r, p, w in found)
        rounds = [r["round"] for r in self.rounds]
        fig, ax = plt.subplots(figsize=(8, 3.2))
        bottom = np.zeros(len(rounds))
        for kind in sorted({k for k, _ in tally}):
            counts = np.array([tally[(kind, k)] for k in rounds], float)
            ax.bar(rounds, counts, bottom=bottom, label=kind)
            bottom += counts
        ax.set(xlabel="round", ylabel="clients absent", title="Absences by reason")
        _whole_rounds(ax)
        ax.legend(fontsize="small")
        return _img(fig, "absences by reason")

    def weights(self) -> str:
        """FedAMP's xi (the last round written) or the inferred graph: the coordinator's."""
        if self.cid is not None:
            return ""
        if self.n > MOST_DRAWN:
            return (f'<h2>Who learns from whom</h2><p class="note">{self.n} clients: more than '
                    f"{MOST_DRAWN}, not drawn (xi/ and metrics.json hold them).</p>")
        plt = _plt()
        try:
            matrices = load_xi(self.folder)[1]
        except (OSError, ValueError):
            matrices = {}
        matrices = {k: m for k, m in matrices.items() if _square(m)}
        graph = self.run.extra.get("inferred_graph")
        edges = graph.get("edges") if isinstance(graph, dict) else None
        if matrices:
            last = max(matrices)
            matrix, title = np.asarray(matrices[last], float), f"FedAMP's weights xi, round {last}"
        elif isinstance(edges, list) and self.n:
            n = self.n
            matrix = np.zeros((n, n))
            pairs = np.array([e for e in edges if isinstance(e, list) and len(e) == 2 and all(
                isinstance(i, int) and 0 <= i < n for i in e)], dtype=np.int64).reshape(-1, 2)
            matrix[pairs[:, 0], pairs[:, 1]] = matrix[pairs[:, 1], pairs[:, 0]] = 1.0
            title = "The inferred client graph (edges)"
        else:
            return ""
        fig, ax = plt.subplots(figsize=(5.5, 4.6))
        image = ax.imshow(matrix, cmap="viridis", interpolation="nearest")
        fig.colorbar(image, ax=ax)
        ax.set(title=title, xlabel="client j", ylabel="client i")
        ticks = np.arange(0, len(matrix), max(1, -(-len(matrix) // 20)))
        labels = [self.name(t) for t in ticks]
        ax.set_xticks(ticks, labels, rotation=60, fontsize="small")
        ax.set_yticks(ticks, labels, fontsize="small")
        return f"<h2>Who learns from whom</h2>{_img(fig, title)}"

    def epsilon_plot(self) -> str:
        spent = {cid: e for cid in self.clients() if (e := self.epsilon(cid)) is not None}
        if not spent:
            return ""
        plt = _plt()
        fig, ax = plt.subplots(figsize=(8, 3))
        if self.cid is not None:  # the member's own, round by round
            own = self._spent.get(self.cid, [])
            ax.plot([k for k, _ in own], [v for _, v in own], marker="o", color="#c63")
            ax.set(xlabel="round", ylabel="epsilon spent",
                   title=f"{self.member}'s privacy spent, as it reported it")
            _whole_rounds(ax)
        else:
            ax.bar([self.name(c) for c in spent], list(spent.values()), color="#c63")
            ax.set(ylabel="epsilon spent",
                   title="Each member's privacy spent (the most it reported)")
            ax.tick_params(axis="x", labelrotation=60, labelsize="small")
        return f"<h2>Privacy</h2>{_img(fig, 'epsilon spent')}"

    def table(self) -> str:
        rows = []
        for cid in self.clients():
            xs, ys = self.curve(cid)
            eps = self.epsilon(cid)
            best, last = (f"{self.score.best(ys):.4g}", f"{ys[-1]:.4g}") if ys else ("-", "-")
            rows.append(f"<tr><td>{_e(self.name(cid))}</td><td>{best}</td><td>{last}</td>"
                        f"<td>{len(xs)}</td><td>{len(self.absences(cid))}</td>"
                        f"<td>{'-' if eps is None else f'{eps:.3g}'}</td></tr>")
        what = "accuracy (%)" if self.score.higher_is_better else self.score.metric
        return (f"<h2>Clients</h2><table><tr><th>client</th><th>best {_e(what)}</th>"
                "<th>last</th><th>rounds evaluated</th><th>absences</th><th>epsilon</th></tr>"
                + "".join(rows) + "</table>")

    def config_table(self) -> str:
        """The run config; on a member's page only how the run trained and its privacy (no
        paths, URIs or files of the coordinator's)."""
        config = {**self.run.config, "mlflow-uri": redact_uri(str(self.run.config.get(
            "mlflow-uri", "")))} if self.cid is None else {
            k: v for k, v in self.run.config.items() if k in MEMBER_KEYS}
        rows = "".join(f"<tr><td>{_e(k)}</td><td>"
                       f"{_e(json.dumps(strict_json(v), allow_nan=False))}</td></tr>"
                       for k, v in sorted(config.items()))
        return f"<details><summary>Run config</summary><table>{rows}</table></details>"

    def html(self) -> str:
        run = self.run
        title = f"{run.run_name or self.folder.name}" + (f": {self.member}" if self.member else "")
        sub = (f"{run.label or run.strategy} on {run.dataset}"
               + (f" ({run.partitioning})" if run.partitioning else "")
               + (f", {run.num_clients} clients" if self.cid is None else "")
               + f", seed {run.seed}; "
               + ("finished" if run.finished else f"not finished ({run.completed_rounds} rounds)")
               + (f"; {run.wall_time_s:.0f} s" if run.wall_time_s else ""))
        if self.member:
            sub += ". A member's page: only this member's numbers."
        body = [f"<h1>{_e(title)}</h1>", f'<p class="sub">{_e(sub)}</p>', self.headline(),
                "<h2>Test curves</h2>", self.curves(), "<h2>Absences</h2>", self.absence_plot(),
                self.weights(), guard_section(run.extra.get("graph_guard"), self.cid is None),
                self.epsilon_plot(), self.table(), self.config_table()]
        csp = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
        return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
                f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
                f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
                + "\n".join(b for b in body if b) + "</body></html>")


def write_page(run_dir: str | Path, out: str | Path | None = None,
               member: str | None = None) -> Path:
    """Write the run's page (a member's with ``member``); its path. ``out``: default
    ``<run>/report.html`` (``report-<member>.html`` for a member's), written as the run's
    other files are (private, atomic, never through a link)."""
    folder = Path(run_dir).expanduser().resolve()
    page = RunPage(folder, member).html().encode()
    path = Path(out).expanduser() if out else folder / (
        f"report-{member}.html" if member is not None else PAGE)
    atomic_write(path, lambda f: f.write(page), private=True)
    return path


def member_names(run_dir: str | Path) -> list[str]:
    """The run's members a page can be made for: each valid name that is one member's."""
    names = RunPage(Path(run_dir).expanduser().resolve()).names
    return [n for n in names if n and names.count(n) == 1]
