"""The ClientApp: a generic worker that runs the client half a message names.

Data and model come from the run config (``dataset``, ``partitioning``,
``data-dir``, ``seed``) and the node config (``partition-id``,
``num-partitions``). What a train or evaluate message asks is a method's
business: the message names a client update under ``client-update``
(:mod:`strategies.client`; none named: plain local training), and this app
builds a :class:`strategies.client.ClientJob` (the received model, the
client's data, the message, the client's ``context.state``, the round's
seed and optimizer settings) and hands it over. It names no method.

train (reply: ``arrays`` and ``metrics`` with ``num-examples``, ``train-loss``,
    ``client-id``, ``server-round``, plus any records the update adds)
    The update trains the received model. Generic keys: ``local-epochs``,
    ``local-steps`` (> 0: that many mini-batch steps instead of epochs),
    ``batch-size``, ``lr``, ``optimizer`` ("adam"/"sgd"), each defaulting
    to the run config's value. A client that the ``attack-ratio`` scenario
    makes an attacker trains on uniformly random labels (see
    :mod:`tasks.scenarios`).
evaluate (reply: ``metrics`` with ``accuracy`` (classification) or ``mse``
    (regression), ``loss``, ``num-examples``, ``client-id``, ``server-round``)
    The update returns the model to test (default: the received one), which
    is tested on the client's own test split.
query (reply: ``info`` ConfigRecord)
    ``client-id``, ``num-partitions``, ``num-train``, ``num-test``, or
    ``error`` saying why the client cannot take part (bad data folder, too
    many clients for the data, ...).

A message this client cannot carry out (an unknown client update, keys of two
methods) gets an error reply with code :data:`strategies.protocol.REFUSED`
naming the keys; the server stops the run on it.
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

import tasks
from strategies.client import (CLIENT_UPDATES, ClientJob, ClientUpdate, Optim, instruction_problem,
                              update_name)
from strategies.protocol import (ACCURACY, ARRAYS, BATCH_SIZE, CLIENT_ID, CONFIG, ERROR, INFO,
                                LOCAL_EPOCHS, LOCAL_STEPS, LOSS, LR, METRICS, MSE, NUM_EXAMPLES,
                                NUM_PARTITIONS, NUM_TEST, NUM_TRAIN, OPTIMIZER, REFUSED,
                                SERVER_ROUND, TRAIN_LOSS)
from tasks.scenarios import flip_labels
from tasks.train import evaluate as evaluate_model

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
    if cfg.attack_ratio > 0 and tasks.data_info(dc).kind == tasks.REGRESSION:
        raise ConfigError(f"run config 'attack-ratio' = {cfg.attack_ratio} is invalid for the "
                          f"regression data of {cfg.dataset!r}; allowed: 0")
    try:
        data = tasks.load_client_data(dc, pid)
    except FileNotFoundError as err:
        raise ConfigError(f"run config 'data-dir' = {cfg.data_dir!r}: {err}") from None
    except tasks.ClientCountError as err:
        raise ConfigError(str(err)) from None
    except ValueError as err:
        setting = (f"'dataset' = {cfg.dataset!r}" if tasks.get_task(cfg.dataset).federated
                   else f"'dataset' = {cfg.dataset!r}, 'partitioning' = {cfg.partitioning!r}")
        raise ConfigError(f"run config {setting} with num-partitions = {n} clients: {err}") from None
    return cfg, pid, dc, data


def _seed(cfg: RunConfig, server_round: int, pid: int) -> int:
    """Seed of a client's mini-batch order (and random labels) in a round."""
    return cfg.seed * 100_003 + server_round * 1_009 + pid


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Say who this client is, or why it cannot take part."""
    try:
        _, pid, dc, data = _setup(context)
        info = {CLIENT_ID: pid, NUM_PARTITIONS: dc.num_clients,
                NUM_TRAIN: len(data.y_train), NUM_TEST: len(data.y_test)}
    except Exception as err:  # reported to the server, which stops the run
        pid = context.node_config.get("partition-id", -1)
        info = {CLIENT_ID: pid if isinstance(pid, int) else -1,
                ERROR: f"{type(err).__name__}: {err}"}
    return Message(RecordDict({INFO: ConfigRecord(info)}), reply_to=msg)


def _job(msg: Message, context: Context, train: bool) -> tuple[ClientUpdate, ClientJob, int]:
    """The client update the message names (checked: :func:`instruction_problem`) and its job."""
    c = msg.content[CONFIG]
    cfg, pid, dc, data = _setup(context)
    server_round = int(c.get(SERVER_ROUND, 0))
    seed = _seed(cfg, server_round, pid)
    targets = data.y_train
    if train and pid in cfg.roles(dc.num_clients).attackers:  # the attack-ratio scenario
        classes = tasks.data_info(dc).num_outputs
        targets = flip_labels(data.y_train, classes, torch.Generator().manual_seed(seed))
    model = tasks.build_model(dc)
    model.load_state_dict(msg.content[ARRAYS].to_torch_state_dict())
    optim = Optim(batch_size=int(c.get(BATCH_SIZE, cfg.batch_size)),
                  lr=float(c.get(LR, cfg.learning_rate)),
                  optimizer=str(c.get(OPTIMIZER, cfg.optimizer)), device=_device())
    job = ClientJob(model=model, data=data, targets=targets, content=msg.content, config=c,
                    state=context.state, server_round=server_round, seed=seed,
                    epochs=int(c.get(LOCAL_EPOCHS, cfg.local_epochs)),
                    steps=int(c.get(LOCAL_STEPS, cfg.local_steps)), optim=optim)
    return CLIENT_UPDATES[update_name(c)], job, pid


def _refusal(msg: Message, reason: str) -> Message:
    return Message(Error(code=REFUSED, reason=reason), reply_to=msg)


def _metrics(job: ClientJob, pid: int, **values) -> MetricRecord:
    return MetricRecord({**values, CLIENT_ID: pid, SERVER_ROUND: job.server_round})


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Run the named client update on the received model; reply the trained model."""
    problem = instruction_problem(msg.content[CONFIG], train=True)
    if problem is not None:
        return _refusal(msg, problem)
    update, job, pid = _job(msg, context, train=True)
    loss, records = update.train(job)
    taken = {ARRAYS, METRICS} & set(records)
    if taken:
        raise ValueError(f"client update {update.name!r} returned records named {sorted(taken)}, "
                         "which the reply uses itself")
    metrics = _metrics(job, pid, **{NUM_EXAMPLES: len(job.data.y_train), TRAIN_LOSS: loss})
    arrays = ArrayRecord(job.model.to("cpu").state_dict())
    return Message(RecordDict({ARRAYS: arrays, METRICS: metrics, **records}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Test the model that the named client update makes of the received one."""
    problem = instruction_problem(msg.content[CONFIG], train=False)
    if problem is not None:
        return _refusal(msg, problem)
    update, job, pid = _job(msg, context, train=False)
    result = evaluate_model(update.evaluate(job), job.data.x_test, job.data.y_test, device=_device())
    scores = {LOSS: result.loss, **({ACCURACY: result.accuracy} if result.accuracy is not None
                                     else {MSE: result.mse})}
    metrics = _metrics(job, pid, **{NUM_EXAMPLES: len(job.data.y_test), **scores})
    return Message(RecordDict({METRICS: metrics}), reply_to=msg)
