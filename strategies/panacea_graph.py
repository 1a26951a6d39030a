"""Panacea's client graph and its clients' embeddings (:mod:`strategies.panacea`): the graph
inferred from warm-up updates (:class:`WarmUp`), a client added to the graph and to GH's table
of embeddings h^(0), a newcomer's embedding placed by its graph neighbours, and whom each
client's embedding takes from (a card's ``learned_from``)."""

from __future__ import annotations

from logging import INFO, WARNING

import numpy as np
import torch
from flwr.supercore import log
from torch import nn

from tasks.graphs import cosine_knn_graph, edge_agreement

from .hypernetwork import GraphHyperNetwork

EMBEDDINGS = "embeddings.weight"  # GH's table of the clients' embeddings h^(0)


def propagated(prop: torch.Tensor | None, layers: int) -> torch.Tensor | None:
    """Whom each client's embedding takes from through GH's ``layers`` GCN layers: the
    propagation's power (the layers' weights and nonlinearities left out), rows scaled to
    sum to 1, float64 on the CPU: a client's card's ``learned_from``."""
    if prop is None:
        return None
    power = torch.linalg.matrix_power(prop.detach().double().cpu(), layers)
    return power / power.sum(dim=1, keepdim=True)


def grown(adjacency: torch.Tensor) -> torch.Tensor:
    """``adjacency`` with one more client, without edges."""
    n = adjacency.shape[0]
    out = adjacency.new_zeros(n + 1, n + 1)
    out[:n, :n] = adjacency
    return out


def grow(net: GraphHyperNetwork, optimizer: torch.optim.Optimizer, extra: torch.Tensor) -> None:
    """One more client in ``net``: its embedding ``extra`` appended; the optimizer's momentum
    of the others kept, the new row's starting at zero."""
    old = net.embeddings.weight
    new = nn.Parameter(torch.cat([old.detach(), extra]))
    net.embeddings.weight = new
    net.embeddings.num_embeddings = new.shape[0]
    for group in optimizer.param_groups:
        group["params"] = [new if p is old else p for p in group["params"]]
    state = optimizer.state.pop(old, None)
    if state is not None:
        if state.get("momentum_buffer") is not None:
            buf = state["momentum_buffer"]
            state["momentum_buffer"] = torch.cat([buf, torch.zeros_like(buf[:1])])
        optimizer.state[new] = state


def placed(own: torch.Tensor, edges: torch.Tensor, neighbours: torch.Tensor, clients: list[int],
           started_from: dict[int, str], enabled: bool = True) -> torch.Tensor:
    """New clients' embeddings h^(0) (``own``: their draws, N(0, 1)) placed by their graph
    neighbours: the mean of the trained embeddings ``neighbours`` each has an edge to
    (``edges``: new x trained, 0/1); a client with none, or every client where not
    ``enabled``, keeps its draw. Deviation: the paper's novel clients keep their draws, and
    only GH's GCN brings their neighbours in. ``started_from`` is told which, by client id."""
    weights = (edges > 0).to(own.dtype).cpu()
    counts = weights.sum(dim=1)
    out = own.detach().clone()
    has = (counts > 0) & enabled
    counts = counts * has
    if bool(has.any()):
        out[has.to(out.device)] = ((weights[has] / counts[has, None]).to(out)
                                   @ neighbours.to(out))
    for cid, k in zip(clients, counts.tolist(), strict=True):
        started_from[cid] = (f"its embedding placed by {int(k)} graph neighbours"
                             if k else "its own embedding, drawn")
    return out


def embedding_rows(where: list, net: GraphHyperNetwork) -> list[list]:
    """Where a checkpoint's ``where`` (GH's state and its SGD's) holds a row of each client:
    its embedding h^(0) and that embedding's momentum."""
    index = next(i for i, p in enumerate(net.parameters()) if p is net.embeddings.weight)
    return [[*where, "hnet", EMBEDDINGS], [*where, "optimizer", "state", index,
                                           "momentum_buffer"]]


class WarmUp:
    """The warm-up of an inferred graph: each client's updates from the initial model summed
    (float64) and counted, until the graph of their means is inferred (:meth:`infer`)."""

    def __init__(self, clients: int, num_params: int) -> None:
        self.sums = torch.zeros(clients, num_params, dtype=torch.float64)
        self.counts = torch.zeros(clients, dtype=torch.long)

    def add(self, rows: torch.Tensor, params: torch.Tensor, initial: torch.Tensor) -> None:
        """The updates ``params - initial`` of the clients ``rows``."""
        self.sums.index_add_(0, rows.cpu(), params.double().cpu() - initial.double().cpu())
        self.counts.index_add_(0, rows.cpu(), torch.ones(len(rows), dtype=torch.long))

    def grow(self) -> None:
        """One more client, with no update yet."""
        self.sums = torch.cat([self.sums, self.sums.new_zeros(1, self.sums.shape[1])])
        self.counts = torch.cat([self.counts, self.counts.new_zeros(1)])

    def load(self, sums: torch.Tensor, counts: torch.Tensor) -> None:
        """A checkpoint's sums, refused where they are not this run's size."""
        if tuple(sums.shape) != tuple(self.sums.shape) or len(counts) != len(sums):
            raise ValueError(f"the checkpoint's warm-up sums are {tuple(sums.shape)}, the "
                             f"run's {tuple(self.sums.shape)}")
        self.sums, self.counts = sums.double(), counts.long()

    def infer(self, server_round: int, k_wanted: int, similarity: str,
              apart: torch.Tensor | None, client_ids: list[int],
              truth: torch.Tensor | None) -> tuple[torch.Tensor, dict]:
        """The ``k_wanted``-nearest-neighbour graph of the clients' mean updates
        (:func:`tasks.graphs.cosine_knn_graph`; ``apart``: pairs the policy keeps apart), and
        its note for the history (edges by client id, clients that never trained, and, where
        the task's own graph ``truth`` is given, the edges' precision and recall), logged."""
        count = self.counts
        mean = self.sums / count.clamp(min=1)[:, None].double()
        k = min(k_wanted, len(count) - 1)
        if k < k_wanted:  # a members run with fewer members than graph-k + 1
            log(WARNING, "graph-k = %d but the run has %d clients: each chooses %d",
                k_wanted, len(count), k)
        adj = cosine_knn_graph(mean.numpy(), k, None if apart is None else apart.numpy(),
                               similarity) if k >= 1 else np.zeros((1, 1), np.float32)
        note: dict = {"round": server_round, "k": k, "similarity": similarity,
                      "untrained_clients": [client_ids[r] for r in
                                            torch.nonzero(count == 0).flatten().tolist()],
                      "edges": [[client_ids[int(a)], client_ids[int(b)]]
                                for a, b in zip(*np.nonzero(np.triu(adj, k=1)))]}
        if truth is not None and tuple(truth.shape) == adj.shape:
            note["against_truth"] = edge_agreement(adj, truth.numpy())
        if note["untrained_clients"]:
            log(WARNING, "Round %d: %d client(s) trained in no warm-up round (client ids %s): "
                "they have no edges (their embeddings are trained alone)", server_round,
                len(note["untrained_clients"]), note["untrained_clients"])
        log(INFO, "Round %d: client graph inferred from the warm-up updates: %d edges "
            "(k = %d)%s", server_round, len(note["edges"]), k_wanted,
            "; against the task's graph: precision {precision:.3f}, recall {recall:.3f}".format(
                **note["against_truth"]) if "against_truth" in note else "")
        return torch.from_numpy(adj), note
