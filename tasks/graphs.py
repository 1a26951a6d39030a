"""Client relation graphs (the ``graph`` run-config key) and their validation.

* ``task``: the graph the task defines (fl60, tpt48, an npz file's ``adjacency``);
* ``file``: ``graph-file``, either a CSV edge list over client ids (one
  ``u,v`` pair per line, an optional header line; edges are undirected) or an
  ``.npz`` file with an (n, n) ``adjacency``; in a run over members' own data
  the edge list names members by their ``client-id`` (an edge naming a member
  that is not in the run, or not yet, is left out);
* ``groups``: clients of one group of the data setting are connected (the
  practical partitioning's groups; elsewhere client ``i`` of ``n`` is in
  group ``i * G // n``, ``G = min(5, n)``);
* ``none``: no graph.

A graph is returned as a float32 0/1 (n, n) matrix with a zero diagonal
(weights > 0 count as edges). A graph with the wrong number of clients, an
edge to an unknown client or a non-symmetric adjacency raises
:class:`GraphError`.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from .files import write_private_text
from .recipes import client_group


class GraphError(ValueError):
    """An invalid client graph."""


def validate_adjacency(adj: np.ndarray, num_clients: int, source: str) -> np.ndarray:
    """Check an adjacency matrix and return it as a 0/1 float32 matrix without self-loops."""
    adj = np.asarray(adj)
    if adj.shape != (num_clients, num_clients):
        raise GraphError(f"{source}: adjacency is {adj.shape}, the run has {num_clients} clients")
    if not np.isfinite(adj).all():
        raise GraphError(f"{source}: adjacency has non-finite entries")
    if not np.array_equal(adj, adj.T):
        bad = np.argwhere(adj != adj.T)[0]
        raise GraphError(f"{source}: adjacency is not symmetric (A[{bad[0]},{bad[1]}] != "
                         f"A[{bad[1]},{bad[0]}]); give an undirected graph")
    out = (adj > 0).astype(np.float32)
    np.fill_diagonal(out, 0.0)
    return out


def read_edges(path: Path, named: bool = False) -> list[tuple[int, str, str]]:
    """The edges of a CSV edge list as (line number, u, v): client ids (``u,v`` integers
    >= 0 after an optional header line), or member names (``named``); comment lines
    (``#``) and empty lines skipped. A GraphError names the first line that is neither."""
    edges = []
    with open(path, newline="") as f:
        for line_no, row in enumerate(csv.reader(f), start=1):
            if not row or row[0].strip().startswith("#"):
                continue
            if named:
                if len(row) < 2:
                    raise GraphError(f"{path}:{line_no}: expected 'u,v' member names, got {row}")
                edges.append((line_no, row[0].strip(), row[1].strip()))
                continue
            try:
                u, v = int(row[0]), int(row[1])
            except (ValueError, IndexError):
                if line_no == 1:
                    continue  # header
                raise GraphError(f"{path}:{line_no}: expected 'u,v' client ids, got {row}") from None
            if min(u, v) < 0:
                raise GraphError(f"{path}:{line_no}: edge {u}-{v} names a negative client id")
            edges.append((line_no, str(u), str(v)))
    return edges


def read_edge_list(path: Path, num_clients: int, names: list[str] | None = None) -> np.ndarray:
    """Read an undirected CSV edge list over client ids 0..n-1, or, with ``names`` (the
    members' names by client id), over member names (edges naming others are left out)."""
    adj = np.zeros((num_clients, num_clients), dtype=np.float32)
    if names is not None:
        index = {name: i for i, name in enumerate(names)}
        for _, u_name, v_name in read_edges(path, named=True):
            if u_name in index and v_name in index and u_name != v_name:
                adj[index[u_name], index[v_name]] = adj[index[v_name], index[u_name]] = 1.0
        return adj
    for line_no, a, b in read_edges(path):
        u, v = int(a), int(b)
        for c in (u, v):
            if not c < num_clients:
                raise GraphError(f"{path}:{line_no}: edge {u}-{v} names client {c}, "
                                 f"outside 0..{num_clients - 1}")
        adj[u, v] = adj[v, u] = 1.0
    return adj


def check_graph_file(graph_file: str, named: bool = False) -> None:
    """Read ``graph-file`` as :func:`build_graph` will, before the run knows its clients: a
    file; an ``.npz``'s square, symmetric ``adjacency``, or a CSV edge list's lines
    (``named``: member names). GraphError names what does not hold; a client id beyond the
    run's clients is found once the run knows them."""
    path = Path(graph_file).expanduser()
    if not path.is_file():
        raise GraphError(f"run config 'graph-file' = '{graph_file}' is not a file")
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            if "adjacency" not in data.files:
                raise GraphError(f"{path}: no 'adjacency' array")
            adj = data["adjacency"]
        if adj.ndim != 2 or adj.shape[0] != adj.shape[1]:
            raise GraphError(f"{path}: adjacency is {adj.shape}, not a square matrix")
        validate_adjacency(adj, adj.shape[0], str(path))
        return
    read_edges(path, named)


def knn_graph(weights: np.ndarray, k: int) -> np.ndarray:
    """The undirected k-nearest-neighbour graph of a (n, n) matrix of affinities (FedAMP's
    weights xi): each client's ``k`` largest off-diagonal entries (ties to the lower client
    id), an edge where either end chose the other; a 0/1 float32 matrix, zero diagonal."""
    w = np.asarray(weights, dtype=np.float64)
    n = w.shape[0]
    if w.shape != (n, n) or not 1 <= k < n:
        raise GraphError(f"a k-nearest-neighbour graph needs a square matrix and 1 <= k < n; "
                         f"got shape {w.shape} and k = {k}")
    masked = np.where(np.eye(n, dtype=bool), -np.inf, w)
    chosen = np.argsort(-masked, axis=1, kind="stable")[:, :k]
    adj = np.zeros((n, n), dtype=np.float32)
    adj[np.repeat(np.arange(n), k), chosen.ravel()] = 1.0
    adj = np.maximum(adj, adj.T)
    np.fill_diagonal(adj, 0.0)
    return adj


#: how two clients' vectors are compared (run config ``graph-similarity``): ``cosine`` of the
#: vectors as they are, or ``centered``: the cosine of the vectors less their mean over the
#: clients (the direction all clients share taken out; Pearson's correlation across clients)
SIMILARITIES = ("cosine", "centered")


def cosine_knn_graph(updates: np.ndarray, k: int, apart: np.ndarray | None = None,
                     similarity: str = "cosine") -> np.ndarray:
    """The ``k``-nearest-neighbour graph (as :func:`knn_graph`: each client's ``k`` most
    similar, ties to the lower client id, an edge where either end chose the other) of the
    clients' update vectors (one row each) by cosine similarity (``similarity``
    ``centered``: of the vectors less the trained clients' mean vector). A zero row (a client
    that never trained) chooses no one and no one chooses it: it has no edges; among the
    others each chooses ``min(k, others)``. ``apart``: (n, n) boolean, pairs that may not
    choose each other (a collaboration policy): each client chooses among the others."""
    u = np.asarray(updates, dtype=np.float64)
    n = u.shape[0]
    if u.ndim != 2 or not 1 <= k < n:
        raise GraphError(f"a k-nearest-neighbour graph needs one row per client and "
                         f"1 <= k < n; got shape {u.shape} and k = {k}")
    if similarity not in SIMILARITIES:
        raise GraphError(f"similarity {similarity!r} is unknown; allowed: "
                         f"{', '.join(SIMILARITIES)}")
    trained = np.linalg.norm(u, axis=1) > 0
    if similarity == "centered" and trained.any():
        u = np.where(trained[:, None], u - u[trained].mean(axis=0), 0.0)
    norms = np.linalg.norm(u, axis=1)
    trained &= norms > 0
    unit = np.divide(u, norms[:, None], out=np.zeros_like(u), where=trained[:, None])
    sim = unit @ unit.T
    sim[:, ~trained] = -np.inf
    if apart is not None:
        sim[np.asarray(apart, dtype=bool)] = -np.inf
    np.fill_diagonal(sim, -np.inf)
    chosen = np.argsort(-sim, axis=1, kind="stable")[:, :k]
    rows = np.repeat(np.arange(n), k)
    keep = np.isfinite(sim[rows, chosen.ravel()]) & trained[rows]
    adj = np.zeros((n, n), dtype=np.float32)
    adj[rows[keep], chosen.ravel()[keep]] = 1.0
    adj = np.maximum(adj, adj.T)
    np.fill_diagonal(adj, 0.0)
    return adj


def edge_agreement(found: np.ndarray, truth: np.ndarray) -> dict[str, float | int]:
    """How the edges of ``found`` match those of ``truth`` (both 0/1 (n, n), symmetric):
    ``precision`` (the share of found edges that are true), ``recall`` (the share of true
    edges found) and the edge counts."""
    f = np.triu(np.asarray(found) > 0, k=1)
    g = np.triu(np.asarray(truth) > 0, k=1)
    both = int((f & g).sum())
    return {"edges": int(f.sum()), "true_edges": int(g.sum()), "common": both,
            "precision": both / max(int(f.sum()), 1), "recall": both / max(int(g.sum()), 1)}


def write_edge_list(path: Path, adj: np.ndarray, names: list[str] | None = None) -> int:
    """Write the edges of a 0/1 adjacency as the CSV edge list ``graph = "file"`` reads
    (``u,v`` per edge, ``u < v``; member names where ``names`` are given); the edge count."""
    u, v = np.nonzero(np.triu(np.asarray(adj) > 0, k=1))
    label = (lambda i: names[i]) if names is not None else str
    rows = ["u,v"] + [f"{label(int(a))},{label(int(b))}" for a, b in zip(u, v)]
    write_private_text(path, "\n".join(rows) + "\n")
    return len(u)


def same_group_graph(groups: list[int]) -> np.ndarray:
    """Clients of the same group connected (``groups``: each client's group); a 0/1 float32
    matrix with a zero diagonal, without edges where every client is its own group."""
    g = np.asarray(groups)
    adj = (g[:, None] == g[None, :]).astype(np.float32)
    np.fill_diagonal(adj, 0.0)
    return adj


def group_graph(num_clients: int, groups: int = 5,
                client_groups: list[int] | None = None) -> np.ndarray:
    """Clients of the same group connected: ``client_groups`` (each client's group, the data
    setting's), else ``groups`` groups of consecutive ids; a GraphError where that gives
    no edge (``graph = "groups"`` asks for the groups' edges)."""
    adj = same_group_graph(client_groups if client_groups is not None
                           else [client_group(i, num_clients, groups) for i in range(num_clients)])
    if not adj.any():
        raise GraphError(f"run config 'graph' = 'groups' gives no edges with {num_clients} "
                         f"clients (each is its own group); allowed with more clients than groups")
    return adj


def build_graph(kind: str, num_clients: int, task_adjacency: np.ndarray | None = None,
                graph_file: str = "", dataset: str = "",
                client_groups: list[int] | None = None,
                names: list[str] | None = None) -> np.ndarray | None:
    """Return the client graph of ``kind`` (see the module docstring), validated.

    ``client_groups``: each client's group in the data setting, for ``groups``;
    ``names``: the members' names by client id, for a ``file`` edge list over names.
    """
    if kind == "none":
        return None
    if kind == "groups":
        return group_graph(num_clients, client_groups=client_groups)
    if kind == "task":
        if task_adjacency is None:  # the run config refused a task without one before
            raise GraphError(f"run config 'graph' = 'task' but dataset '{dataset}' defines no "
                             "graph (its data holds none); give a graph-file instead")
        return validate_adjacency(task_adjacency, num_clients, f"dataset '{dataset}'")
    if kind == "file":
        path = Path(graph_file).expanduser()
        if not path.is_file():
            raise GraphError(f"run config 'graph-file' = '{graph_file}' is not a file")
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as data:
                if "adjacency" not in data.files:
                    raise GraphError(f"{path}: no 'adjacency' array")
                return validate_adjacency(data["adjacency"], num_clients, str(path))
        if names is not None:
            names = list(names)[:num_clients]
        return validate_adjacency(read_edge_list(path, num_clients, names), num_clients, str(path))
    raise GraphError(f"run config 'graph' = '{kind}' is invalid; allowed: task, file, groups, none")
