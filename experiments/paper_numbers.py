"""The published numbers a table is printed beside: the Panacea paper's (Chen et al.,
"Graph-Relational Federated Learning", Table 1), as docs/reproducing.md and issue 42 (which
asked for this table) quote them: FL-60 and TPT-48 from the docs' tables, SFL's and the
traffic tasks' from the issue. The paper itself is not on these machines; its Table 2
(novel clients) is not quoted anywhere here, so no line is printed under a novel table.

Keyed by dataset and variant (the run config's ``fl60-variant``, ``tpt48-split``,
``traffic-graph``; "" for none) and by table ("personal": Table 1, the training clients;
"novel": Table 2, clients held out of training). Values are in the paper's units: BMTA in
percent; MSE on the [0, 1]-scaled data, printed as the paper prints it (x1e-3 for the
traffic tasks). A generated stand-in (``traffic-generated``) is printed beside the numbers of
the real data it stands in for, said so: they are not comparable numbers.
"""

from __future__ import annotations

from collections.abc import Mapping

#: (dataset, variant) -> table -> method -> the paper's value
PANACEA: dict[tuple[str, str], dict[str, dict[str, float]]] = {
    ("fl60", "grda"): {"personal": {"fedavg": 97.9, "sfl": 73.3, "pfedhn": 100.0,
                                    "panacea-gn": 100.0, "panacea": 100.0}},
    ("tpt48", "random"): {"personal": {"fedavg": 0.0026, "sfl": 0.0029, "pfedhn": 0.0022,
                                       "panacea": 0.0026}},
    ("metr-la", ""): {"personal": {"fedavg": 112.4e-3, "sfl": 73.2e-3, "pfedhn": 3.2e-3,
                                   "panacea-gn": 3.2e-3, "panacea": 1.0e-3}},
    ("pems-bay", ""): {"personal": {"fedavg": 33.5e-3, "sfl": 36.4e-3, "pfedhn": 3.6e-3,
                                    "panacea-gn": 1.2e-3, "panacea": 0.4e-3}},
}
#: the dataset of the paper a stand-in's variant is printed beside
STANDS_IN_FOR = {("traffic-generated", "metr-la"): ("metr-la", ""),
                 ("traffic-generated", "pems-bay"): ("pems-bay", "")}
_VARIANT_KEYS = {"fl60": "fl60-variant", "tpt48": "tpt48-split",
                 "traffic-generated": "traffic-graph"}
_DEFAULT_VARIANT = {"fl60": "text", "tpt48": "time", "traffic-generated": "metr-la"}


def variant_of(dataset: str, config: Mapping) -> str:
    """A run's variant of its dataset ("" where the dataset has none)."""
    key = _VARIANT_KEYS.get(dataset)
    return str(config.get(key, _DEFAULT_VARIANT[dataset])) if key else ""


def paper_line(dataset: str, variant: str, novel: bool = False) -> str | None:
    """One line: the Panacea paper's numbers of a data setting (None where these docs hold
    none)."""
    real = STANDS_IN_FOR.get((dataset, variant), (dataset, variant))
    numbers = PANACEA.get(real, {}).get("novel" if novel else "personal")
    if not numbers:
        return None
    traffic = real[0] in ("metr-la", "pems-bay")
    cells = ", ".join(f"{m} {v * 1e3:.1f}" if traffic else f"{m} {v:g}"
                      for m, v in numbers.items())
    name = real[0] + (f" ({real[1]})" if real[1] else "")
    units = " (MSE x1e-3)" if traffic else ""
    said = (f"; **this setting is a generated stand-in on {real[0]}'s road graph: not "
            "comparable numbers**" if real != (dataset, variant) else "")
    table = "Table 2" if novel else "Table 1"
    return f"Panacea paper, {table}, {name}{units}: {cells}{said}."
