"""Panacea's client graph and its clients' embeddings (:mod:`strategies.panacea`): the graph
inferred from warm-up updates (:class:`WarmUp`), a client added to the graph and to GH's table
of embeddings h^(0), a newcomer's embedding placed by its graph neighbours, and whom each
client's embedding takes from (a card's ``learned_from``)."""

from __future__ import annotations

from collections.abc import Sequence
from logging import INFO, WARNING

import numpy as np
import torch
from flwr.supercore import log
from torch import nn

from tasks.graphs import cosine_knn_graph, edge_agreement

from .core.layout import FlatLayout
from .graph_guard import Arm
from .hypernetwork import GraphHyperNetwork
from .panacea_client import PanaceaSettings

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


def new_hypernetwork(flat: FlatLayout, clients: int, seed: int, device: torch.device,
                     sizes: dict, generator: bool, s: PanaceaSettings
                     ) -> tuple[GraphHyperNetwork, torch.optim.Optimizer]:
    """A hypernetwork of ``sizes`` over ``clients`` clients whose heads make the parameters of
    the model ``flat`` lays out (seeded by the run's ``seed``), and its SGD at the settings
    ``s``."""
    heads = [int(np.prod(flat.shapes[k])) for k in flat.float_keys[: flat.num_param_keys]]
    torch.manual_seed(seed)
    net = GraphHyperNetwork(clients, heads, generator=generator, **sizes)
    net.to(device)
    return net, torch.optim.SGD(net.parameters(), lr=float(s.panacea_server_lr),
                                momentum=s.panacea_server_momentum,
                                weight_decay=float(s.panacea_server_weight_decay))


def warm_embeddings(mine: dict, old: object, old_rows: Sequence[int | None],
                    adjacency: torch.Tensor | None, client_ids: list[int],
                    started_from: dict[int, str], place: bool = True) -> dict:
    """GH's state (``mine``: this run's, as built) from another run's (``old``: its
    ``hnet``): its encoder, generator and heads, each returning client's embedding h^(0) from
    its row there (``old_rows``: by this run's row, None for a client new to it), and a
    client new to this run placed by its returning graph neighbours (:func:`placed`, where
    ``place``); ``started_from`` is told which, by client id. Refused where ``old`` is not a
    hypernetwork of this run's sizes, graph and generator."""
    if not isinstance(old, dict) or EMBEDDINGS not in old:
        raise ValueError("it keeps no hypernetwork this run can start from")
    differ = sorted(k for k in set(mine) | set(old) if k not in mine or k not in old or (
        k != EMBEDDINGS and tuple(mine[k].shape) != tuple(old[k].shape)))
    if differ or mine[EMBEDDINGS].shape[1] != old[EMBEDDINGS].shape[1]:
        raise ValueError(f"its hypernetwork is not this run's (differs in "
                         f"{differ[:3] or [EMBEDDINGS]}: the method's sizes, graph or "
                         "generator)")
    emb = mine[EMBEDDINGS].clone()
    back = [r for r, o in enumerate(old_rows) if o is not None]
    new = [r for r, o in enumerate(old_rows) if o is None]
    emb[back] = old[EMBEDDINGS][[o for o in old_rows if o is not None]].to(emb)
    for r in back:
        started_from[client_ids[r]] = "its own embedding"
    if new and back and adjacency is not None:
        emb[new] = placed(emb[new], adjacency[new][:, back], emb[back],
                          [client_ids[r] for r in new], started_from, place)
    else:
        started_from.update({client_ids[r]: "its own embedding, drawn" for r in new})
    return {**{k: v.to(mine[k]) for k, v in old.items()}, EMBEDDINGS: emb}


def joined(main: Arm, adjacency: torch.Tensor | None, trained_rows: torch.Tensor,
           gen: torch.Generator, client_id: int, started_from: dict[int, str],
           place: bool = True) -> None:
    """A client that joins after GH was built: its embedding h^(0), drawn by ``gen`` as the
    others' were (N(0, 1)) and placed by its trained graph neighbours (:func:`placed`;
    ``adjacency``: the run's graph with it; ``trained_rows``: the clients that train),
    appended to ``main``'s network (its momentum at zero: :func:`grow`)."""
    old = main.net.embeddings.weight
    extra = torch.randn(1, old.shape[1], generator=gen).to(old)
    n = old.shape[0]
    if adjacency is not None:
        trained = trained_rows[trained_rows < n]
        extra = placed(extra, adjacency[n:, trained], old.detach()[trained], [client_id],
                       started_from, place)
    grow(main.net, main.optimizer, extra)


def embedding_rows(where: list, net: GraphHyperNetwork) -> list[list]:
    """Where a checkpoint's ``where`` (GH's state and its SGD's) holds a row of each client:
    its embedding h^(0) and that embedding's momentum."""
    index = next(i for i, p in enumerate(net.parameters()) if p is net.embeddings.weight)
    return [[*where, "hnet", EMBEDDINGS], [*where, "optimizer", "state", index,
                                           "momentum_buffer"]]


class WarmUp:
    """The warm-up of an inferred graph: each client's updates from the initial model summed
    (float64) and counted, until the graph of their means is inferred (:meth:`infer`).

    Unguarded (``graph-guard-rounds`` = 0), in the first ``graph-warmup-rounds`` rounds every
    sampled client trains from the same initial model (and is tested on it); after the last
    of them the server builds the ``graph-k``-nearest-neighbour graph of the clients' mean
    updates (trained - initial), records its edges (and, where the task's own graph is
    known, their precision and recall) in the history's ``notes``, builds GH on it, takes
    GH's first server steps on that round's models, and trains as Panacea from the next
    round. Clients that trained in no warm-up round have no edges. Guarded, the same sums
    come from the side models (:mod:`strategies.graph_guard`)."""

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
