"""Where a strategy's checkpoint state holds something of each client, and that client's part
zeroed: what ``fedamp-flwr forget`` erases (:mod:`fedamp_flwr.tools.erasure`) without naming any
strategy's keys.

Each strategy declares, in its state (:meth:`strategies.core.base.StrategyBase.client_state`,
written into the checkpoint as ``client_state``), the paths of its per-client parts: ``rows``
(tensors whose first axis is the client id: a stored model per client, an embedding per
client and its optimizer's momentum, the inferred graph's warm-up sums), ``matrices``
(client x client tensors: an inferred graph) and ``maps`` (dicts keyed by the client id as
text: how each client's model started). A path is a list of keys into the nested state (an
optimizer's parameter index is an int). The declaration is part of the checkpoint's sealed
bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

#: the checkpoint state's key of the declaration
CLIENT_STATE = "client_state"
KINDS = ("rows", "matrices", "maps")


def declaration(rows: Sequence[Sequence[Any]] = (), matrices: Sequence[Sequence[Any]] = (),
                maps: Sequence[Sequence[Any]] = ()) -> dict[str, list[list[Any]]]:
    """A strategy's declaration of its per-client parts (paths as lists of keys)."""
    return {"rows": [list(p) for p in rows], "matrices": [list(p) for p in matrices],
            "maps": [list(p) for p in maps]}


def at(state: Any, path: Sequence[Any]) -> Any:
    """The value at ``path`` in the nested ``state`` (None where any key is missing)."""
    for key in path:
        if not isinstance(state, dict) or not isinstance(key, str | int) or key not in state:
            return None
        state = state[key]
    return state


def legacy_declaration(state: dict[str, Any]) -> dict[str, list[list[Any]]]:
    """The declaration a checkpoint's strategy ``state`` of a version before declarations
    would have made: the per-client keys those versions' strategies wrote (FedAMP's and the
    other stores' ``models``; Panacea's GH embeddings and their momentum, the inferred graph
    and its warm-up's sums, and the graph guard's, with its two hypernetworks), where
    ``state`` holds them."""
    rows: list[list[Any]] = [["models"], ["update_sum"], ["update_count"],
                             ["graph_guard", "sums"], ["graph_guard", "counts"]]
    arms = at(state, ["graph_guard", "arms"])
    for where in [[], *(["graph_guard", "arms", k] for k in (arms if isinstance(arms, dict)
                                                             else ()))]:
        hnet = at(state, [*where, "hnet"])
        # the optimizer numbers GH's parameters in their order (the floating ones)
        floating = [k for k, v in hnet.items() if isinstance(v, torch.Tensor)
                    and v.is_floating_point()] if isinstance(hnet, dict) else []
        if "embeddings.weight" not in floating:
            continue
        rows += [[*where, "hnet", "embeddings.weight"],
                 [*where, "optimizer", "state", floating.index("embeddings.weight"),
                  "momentum_buffer"]]
    return declaration(rows=rows, matrices=[["inferred_adjacency"], ["graph_guard", "inferred"]],
                       maps=[["started_from"]])


def forget_client(state: dict[str, Any], cid: int) -> list[str]:
    """Zero client ``cid``'s part of every path ``state`` declares (its row, its row and
    column, its entry; a state of a version before declarations: :func:`legacy_declaration`);
    the paths changed, as text. A declaration that is not a dict of lists of paths, or a path
    that is not there or not of its kind, changes nothing."""
    declared = state[CLIENT_STATE] if CLIENT_STATE in state else legacy_declaration(state)
    changed: list[str] = []
    if not isinstance(declared, dict) or cid < 0:
        return changed
    for kind in KINDS:
        paths = declared.get(kind, [])
        for path in paths if isinstance(paths, list) else []:
            if not isinstance(path, list):
                continue
            value = at(state, path)
            if kind == "maps":
                if isinstance(value, dict) and value.pop(str(cid), None) is not None:
                    changed.append("/".join(map(str, path)))
                continue
            if not isinstance(value, torch.Tensor) or value.ndim < 1 or len(value) <= cid:
                continue
            value[cid] = 0
            if kind == "matrices" and value.ndim == 2 and value.shape[1] > cid:
                value[:, cid] = 0
            changed.append("/".join(map(str, path)))
    return changed
