"""The ClientApp: a generic worker that does what the strategy's message says.

Data and model come from the run config (``dataset``, ``partitioning``,
``data-dir``, ``seed``) and the node config (``partition-id``,
``num-partitions``). What a round does comes from the message's config:

train (reply: ``arrays`` and ``metrics`` with ``num-examples``, ``train-loss``, ``client-id``)
    ``local-epochs``, ``local-steps`` (> 0: that many mini-batch steps instead
    of epochs), ``batch-size``, ``lr``, ``optimizer`` ("adam"/"sgd") and
    ``proximal-mu`` (adds ``proximal-mu / 2 ||w - w_received||^2``: FedProx's
    term, FedAMP's ``lambda / alpha_k``). Training starts from the received arrays.
    A client that the ``attack-ratio`` scenario makes an attacker trains on
    uniformly random labels (see :mod:`tasks.scenarios`).
evaluate (reply: ``metrics`` with ``accuracy`` (classification) or ``mse`` (regression),
    ``loss``, ``num-examples``, ``client-id``)
    ``finetune-epochs`` (> 0: first train that many epochs on the local
    training data, then test). Tests the received arrays on the client's own
    test split.
query (reply: ``info`` ConfigRecord)
    ``client-id``, ``num-partitions``, ``num-train``, ``num-test``, or
    ``error`` saying why the client cannot take part (bad data folder, too
    many clients for the data, ...).
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

import tasks
from tasks.scenarios import flip_labels
from tasks.train import evaluate as evaluate_model
from tasks.train import train as train_model

from .config import ConfigError, RunConfig

app = ClientApp()


def _ids(context: Context) -> tuple[int, int]:
    ids = []
    for key in ("partition-id", "num-partitions"):
        value = context.node_config.get(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(
                f"node config '{key}' = {value!r} is invalid; allowed: an integer (start "
                'SuperNodes with --node-config "partition-id=I num-partitions=N")'
            )
        ids.append(value)
    return ids[0], ids[1]


def _setup(context: Context) -> tuple[RunConfig, int, tasks.DataConfig, tasks.ClientData]:
    """Validate the configs and load this client's data; errors name the key."""
    cfg = RunConfig.from_run_config(context.run_config)
    pid, n = _ids(context)
    if not 0 <= pid < n:
        raise ConfigError(f"node config 'partition-id' = {pid} is outside [0, num-partitions={n})")
    dc = cfg.data_config(n)
    try:
        fed = tasks.load_federated(dc)
    except FileNotFoundError as err:
        raise ConfigError(f"run config 'data-dir' = {cfg.data_dir!r}: {err}") from None
    except ValueError as err:
        setting = (f"'dataset' = {cfg.dataset!r}" if tasks.get_task(cfg.dataset).federated
                   else f"'dataset' = {cfg.dataset!r}, 'partitioning' = {cfg.partitioning!r}")
        raise ConfigError(f"run config {setting} with num-partitions = {n} clients: {err}") from None
    if cfg.attack_ratio > 0 and tasks.data_info(dc).kind == tasks.REGRESSION:
        raise ConfigError(f"run config 'attack-ratio' = {cfg.attack_ratio} is invalid for the "
                          f"regression data of {cfg.dataset!r}; allowed: 0")
    if fed.num_clients != n:
        raise ConfigError(
            f"dataset {cfg.dataset!r} defines {fed.num_clients} clients but num-partitions = {n}; "
            f"allowed: run {fed.num_clients} SuperNodes"
        )
    return cfg, pid, dc, tasks.load_client_data(dc, pid)


def _seed(cfg: RunConfig, server_round: int, pid: int) -> int:
    """Seed of a client's mini-batch order (and random labels) in a round."""
    return cfg.seed * 100_003 + server_round * 1_009 + pid


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _model(dc: tasks.DataConfig, arrays: ArrayRecord) -> torch.nn.Module:
    model = tasks.build_model(dc)
    model.load_state_dict(arrays.to_torch_state_dict())
    return model


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Say who this client is, or why it cannot take part."""
    try:
        _, pid, dc, data = _setup(context)
        info = {"client-id": pid, "num-partitions": dc.num_clients,
                "num-train": len(data.y_train), "num-test": len(data.y_test)}
    except Exception as err:  # reported to the server, which stops the run
        pid = context.node_config.get("partition-id", -1)
        info = {"client-id": pid if isinstance(pid, int) else -1,
                "error": f"{type(err).__name__}: {err}"}
    return Message(RecordDict({"info": ConfigRecord(info)}), reply_to=msg)


def _start(msg: Message, context: Context):
    """Common start of train and evaluate: config, data, round and received model."""
    cfg, pid, dc, data = _setup(context)
    c = msg.content["config"]
    return cfg, pid, dc, data, c, int(c.get("server-round", 0)), _model(dc, msg.content["arrays"])


def _fit(model, cfg: RunConfig, data: tasks.ClientData, c: ConfigRecord, seed: int,
         epochs: int, steps: int = 0, proximal_mu: float = 0.0,
         labels: torch.Tensor | None = None) -> float:
    """Train ``model`` on the local training data with the message's optimizer settings."""
    return train_model(
        model, data.x_train, data.y_train if labels is None else labels, epochs=epochs, steps=steps,
        batch_size=int(c.get("batch-size", cfg.batch_size)),
        lr=float(c.get("lr", cfg.learning_rate)),
        optimizer=str(c.get("optimizer", cfg.optimizer)),
        proximal_mu=proximal_mu, device=_device(), seed=seed,
    )


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the received model on the local data as the message's config says."""
    cfg, pid, dc, data, c, server_round, model = _start(msg, context)
    seed = _seed(cfg, server_round, pid)
    labels = None
    if pid in cfg.roles(dc.num_clients).attackers:  # the attack-ratio scenario
        classes = tasks.data_info(dc).num_outputs
        labels = flip_labels(data.y_train, classes, torch.Generator().manual_seed(seed))
    loss = _fit(model, cfg, data, c, seed=seed,
                epochs=int(c.get("local-epochs", cfg.local_epochs)),
                steps=int(c.get("local-steps", cfg.local_steps)),
                proximal_mu=float(c.get("proximal-mu", 0.0)), labels=labels)
    metrics = MetricRecord({"num-examples": len(data.y_train), "train-loss": loss,
                            "client-id": pid, "server-round": server_round})
    arrays = ArrayRecord(model.to("cpu").state_dict())
    return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Test the received model (optionally fine-tuned first) on the local test split."""
    cfg, pid, _, data, c, server_round, model = _start(msg, context)
    finetune = int(c.get("finetune-epochs", 0))
    if finetune > 0:
        _fit(model, cfg, data, c, seed=_seed(cfg, server_round, pid) + 7, epochs=finetune)
    result = evaluate_model(model, data.x_test, data.y_test, device=_device())
    metrics = MetricRecord({"num-examples": len(data.y_test), **result,
                            "client-id": pid, "server-round": server_round})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)
