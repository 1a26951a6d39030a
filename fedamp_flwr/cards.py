"""A client's model card and the data schema it records: what a member's node writes
beside its model (:mod:`fedamp_flwr.member.keeping`) and what the server writes for a
partitioned run's clients (:mod:`fedamp_flwr.server.delivery`, which also says what is
kept and who writes it).
"""

from __future__ import annotations

import time
from typing import Any

import tasks
from strategies.core.protocol import ACCURACY, LOSS, MSE, NUM_EXAMPLES
from tasks.export import PREPROCESSING, package_version, schema_record

from .config import RunConfig

__all__ = ["ANALYST", "MODEL_DIR", "data_schema", "model_card"]

#: the node config key naming where a node writes its models
MODEL_DIR = "model-dir"
#: the card's scores an analyst reads (``score.analyst``)
ANALYST = "analyst"



def data_schema(cfg: RunConfig, dc: tasks.DataConfig) -> tasks.MemberSchema:
    """The schema of the run's data: the members' (run config), else the task's shape."""
    schema = cfg.member_schema()
    if schema is not None:
        return schema
    info = tasks.data_info(dc)
    return tasks.MemberSchema(info.input_shape, info.kind, info.num_outputs)


def model_card(cfg: RunConfig, dc: tasks.DataConfig, *, run: str, token: str, client_id: int,
               member: str | None, server_round: int, why: str,
               scores: dict[str, Any], standardize: dict[str, Any] | None = None,
               alone: dict[str, Any] | None = None,
               learned_from: dict[str, Any] | None = None,
               started: dict[str, Any] | None = None,
               graph: dict[str, Any] | None = None,
               choice: dict[str, Any] | None = None,
               model_name: str | None = None) -> dict[str, Any]:
    """A model's card (:mod:`tasks.export`), but for the weights' name and hash;
    ``standardize``: the inputs' standardizing statistics (the model works on raw rows
    only with them: ``predict`` applies them); ``alone``: what the member scores alone;
    ``learned_from``: whom the model learned from (:meth:`SaveRequest.of`); ``started``: how
    it started (a warm start's run, round and sha256 as ``warm_start``; ``from``, the start
    itself, as ``started_from``); ``graph``: the client's edges in the run's inferred client
    graph and whether the run uses it (``inferred_graph``); ``choice``: the member's choice
    of the model it keeps, on its held-out rows (fedamp_flwr/member/member_choice.py);
    ``model_name``: the model's own architecture where it is not the run's (a member's
    linear model alone)."""
    schema = data_schema(cfg, dc)
    main = ACCURACY if ACCURACY in scores else MSE
    return {
        "member": member, "client_id": client_id, "run": run, "run_token": token,
        "strategy": cfg.strategy, "settings": cfg.settings.to_dict(),
        "training": {k: cfg.value(k) for k in ("local-epochs", "local-steps", "batch-size",
                                                "learning-rate", "optimizer", "seed")},
        "round": server_round, "why": why,
        "score": {main: scores.get(main), LOSS: scores.get(LOSS),
                  "num_examples": scores.get(NUM_EXAMPLES),
                  # the scores an analyst reads, on the same rows (tasks/scores.py)
                  **({ANALYST: scores[ANALYST]} if ANALYST in scores else {}),
                  "on": ("validation rows (validation-fraction = "
                         f"{cfg.validation_fraction:g})" if cfg.validation_fraction > 0
                         else "test rows")},
        # which of the member's rows the run trained and tested on (fedamp-flwr predict
        # --rows): the rows its file marks, else the seeded 80/20 split of its name and
        # seed; with validation-fraction, the held-out share of the training rows
        "rows": {"seed": cfg.seed, "member": member,
                 "validation_fraction": cfg.validation_fraction,
                 # the share of the training rows the member held out to choose its model
                 **({"held_out_fraction": choice["held_out_fraction"]}
                    if choice and "held_out_fraction" in choice else {}),
                 "validation_index": 0 if member is not None else client_id},
        "dataset": cfg.data_label, "schema": schema_record(schema),
        "preprocessing": {**PREPROCESSING, **({"standardize": standardize} if standardize
                                              else {})},
        **({"alone": alone} if alone else {}),
        **({"choice": choice} if choice else {}),
        **({"learned_from": learned_from} if learned_from else {}),
        **({"inferred_graph": graph} if graph else {}),
        **({"warm_start": {k: started[k] for k in ("run", "round", "sha256")}}
           if started and "run" in started else {}),
        **({"started_from": started["from"]} if started and "from" in started else {}),
        "model": {"name": model_name or tasks.model_name(dc, cfg.model),
                  "input_shape": list(schema.input_shape), "num_outputs": schema.num_outputs},
        "package": {"name": "fedamp-flwr", "version": package_version()},
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
