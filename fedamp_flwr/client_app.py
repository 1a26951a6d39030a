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
    Two options keep state on the client across rounds (``context.state``):

    * ``scaffold`` (true; the message also carries the server control
      variate c as the ArrayRecord ``control``): SCAFFOLD's local update
      with the client's own control variate c_i; the reply adds the
      ArrayRecord ``control-delta`` (c_i+ - c_i).
    * ``apfl-alpha`` (> 0): APFL's update of the received shared model and of
      the client's local model v (see :func:`tasks.train.train_apfl`).
    * ``pfedme-lambda`` (> 0, with ``pfedme-inner-steps``, ``pfedme-personal-lr``):
      pFedMe's update (:func:`tasks.train.train_pfedme`); the personalized
      model theta is kept as ``pfedme-personal``.

    ``per-fedavg-alpha`` (> 0) trains with Per-FedAvg's first-order
    meta-update (:func:`tasks.train.train_per_fedavg`).
evaluate (reply: ``metrics`` with ``accuracy`` (classification) or ``mse`` (regression),
    ``loss``, ``num-examples``, ``client-id``)
    Tests the received arrays on the client's own test split, after
    ``finetune-epochs`` epochs or ``finetune-steps`` steps (> 0) of training on
    the local training data (at ``finetune-lr`` with ``finetune-optimizer``
    when given), or (``apfl-alpha`` > 0) mixed with the client's local model v
    as ``alpha v + (1 - alpha) w``, or (``personal-state``) the model that the
    client keeps under that name, if it has one.
query (reply: ``info`` ConfigRecord)
    ``client-id``, ``num-partitions``, ``num-train``, ``num-test``, or
    ``error`` saying why the client cannot take part (bad data folder, too
    many clients for the data, ...).
"""

from __future__ import annotations

import copy

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

import tasks
from tasks.scenarios import flip_labels
from tasks.train import evaluate as evaluate_model
from tasks.train import mean_gradient, mix_parameters, train_apfl, train_per_fedavg, train_pfedme
from tasks.train import train as train_model

from .config import ConfigError, RunConfig

app = ClientApp()

# context.state keys of the state a client keeps across rounds
SCAFFOLD_STATE = "scaffold-control"
APFL_STATE = "apfl-local"
PFEDME_STATE = "pfedme-personal"


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


def _optim(cfg: RunConfig, c: ConfigRecord) -> dict:
    """The message's optimizer settings (the run config's where the message has none)."""
    return dict(batch_size=int(c.get("batch-size", cfg.batch_size)),
                lr=float(c.get("lr", cfg.learning_rate)),
                optimizer=str(c.get("optimizer", cfg.optimizer)), device=_device())


def _fit(model, cfg: RunConfig, data: tasks.ClientData, c: ConfigRecord, seed: int,
         epochs: int, steps: int = 0, proximal_mu: float = 0.0,
         labels: torch.Tensor | None = None, grad_correction=None) -> float:
    """Train ``model`` on the local training data with the message's optimizer settings."""
    return train_model(
        model, data.x_train, data.y_train if labels is None else labels, epochs=epochs, steps=steps,
        proximal_mu=proximal_mu, grad_correction=grad_correction, seed=seed, **_optim(cfg, c),
    )


def _scaffold(msg: Message, context: Context, model, cfg, data, c, seed, epochs, steps, targets
              ) -> tuple[float, ArrayRecord]:
    """SCAFFOLD's client update (Karimireddy et al. 2020, Alg. 1, lines 7-13, option I).

    Trains with the gradient correction ``c - c_i``, then sets ``c_i+`` to the
    gradient of the local loss at the received model x (option I, Eq. 4 (i):
    correct for any optimizer, where option II's ``(x - y) / (K lr)`` is a
    gradient only for plain SGD) and keeps it in ``context.state``; returns
    the loss and ``c_i+ - c_i``.
    """
    if "control" not in msg.content.array_records:
        raise ValueError("train config 'scaffold' = true but the message has no 'control' ArrayRecord")
    server_c = msg.content["control"].to_torch_state_dict()
    names = [k for k, _ in model.named_parameters()]
    opt = _optim(cfg, c)
    new_c = dict(zip(names, (g.cpu() for g in mean_gradient(
        model, data.x_train, targets, batch_size=opt["batch_size"], device=opt["device"]))))
    own = context.state.array_records.get(SCAFFOLD_STATE)
    client_c = (own.to_torch_state_dict() if own is not None
                else {k: torch.zeros_like(v) for k, v in new_c.items()})
    correction = [server_c[k] - client_c[k] for k in names]
    loss = _fit(model, cfg, data, c, seed, epochs, steps, labels=targets, grad_correction=correction)
    context.state[SCAFFOLD_STATE] = ArrayRecord(new_c)
    return loss, ArrayRecord({k: new_c[k] - client_c[k] for k in names})


def _apfl_local(context: Context, shared: torch.nn.Module) -> torch.nn.Module:
    """The client's APFL local model v from ``context.state`` (first time: a copy of w)."""
    local = copy.deepcopy(shared)
    if APFL_STATE in context.state.array_records:
        local.load_state_dict(context.state[APFL_STATE].to_torch_state_dict())
    return local


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the received model on the local data as the message's config says."""
    cfg, pid, dc, data, c, server_round, model = _start(msg, context)
    seed = _seed(cfg, server_round, pid)
    targets = data.y_train
    if pid in cfg.roles(dc.num_clients).attackers:  # the attack-ratio scenario
        classes = tasks.data_info(dc).num_outputs
        targets = flip_labels(data.y_train, classes, torch.Generator().manual_seed(seed))
    epochs = int(c.get("local-epochs", cfg.local_epochs))
    steps = int(c.get("local-steps", cfg.local_steps))
    apfl_alpha = float(c.get("apfl-alpha", 0.0))
    extra = {}
    if bool(c.get("scaffold", False)):
        loss, extra["control-delta"] = _scaffold(msg, context, model, cfg, data, c, seed,
                                                 epochs, steps, targets)
    elif float(c.get("per-fedavg-alpha", 0.0)) > 0:
        loss = train_per_fedavg(model, data.x_train, targets,
                                alpha=float(c["per-fedavg-alpha"]), epochs=epochs, steps=steps,
                                seed=seed, **_optim(cfg, c))
    elif float(c.get("pfedme-lambda", 0.0)) > 0:
        personal = copy.deepcopy(model)
        opt = _optim(cfg, c)
        loss = train_pfedme(model, personal, data.x_train, targets,
                            lam=float(c["pfedme-lambda"]), inner_steps=int(c.get("pfedme-inner-steps", 5)),
                            personal_lr=float(c.get("pfedme-personal-lr", 0.01)), epochs=epochs,
                            steps=steps, batch_size=opt["batch_size"], lr=opt["lr"],
                            device=opt["device"], seed=seed)
        context.state[PFEDME_STATE] = ArrayRecord(personal.to("cpu").state_dict())
    elif apfl_alpha > 0:
        local = _apfl_local(context, model)
        loss = train_apfl(model, local, data.x_train, targets,
                          alpha=apfl_alpha, epochs=epochs, steps=steps, seed=seed, **_optim(cfg, c))
        context.state[APFL_STATE] = ArrayRecord(local.to("cpu").state_dict())
    else:
        loss = _fit(model, cfg, data, c, seed=seed, epochs=epochs, steps=steps,
                    proximal_mu=float(c.get("proximal-mu", 0.0)), labels=targets)
    metrics = MetricRecord({"num-examples": len(data.y_train), "train-loss": loss,
                            "client-id": pid, "server-round": server_round})
    arrays = ArrayRecord(model.to("cpu").state_dict())
    return Message(RecordDict({"arrays": arrays, "metrics": metrics, **extra}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Test the received model (optionally fine-tuned first) on the local test split."""
    cfg, pid, _, data, c, server_round, model = _start(msg, context)
    finetune, finetune_steps = int(c.get("finetune-epochs", 0)), int(c.get("finetune-steps", 0))
    apfl_alpha = float(c.get("apfl-alpha", 0.0))
    personal = str(c.get("personal-state", ""))
    if finetune > 0 or finetune_steps > 0:
        tune = ConfigRecord({**dict(c), "lr": float(c.get("finetune-lr", c.get("lr", cfg.learning_rate))),
                             "optimizer": str(c.get("finetune-optimizer", c.get("optimizer", cfg.optimizer)))})
        _fit(model, cfg, data, tune, seed=_seed(cfg, server_round, pid) + 7, epochs=finetune,
             steps=finetune_steps)
    if personal and personal in context.state.array_records:  # e.g. pFedMe's theta
        model.load_state_dict(context.state[personal].to_torch_state_dict())
    if apfl_alpha > 0:  # APFL's personalized model alpha v + (1 - alpha) w
        local = _apfl_local(context, model)
        with torch.no_grad():
            mixed = mix_parameters(local, model, apfl_alpha)
            for name, p in model.named_parameters():
                p.copy_(mixed[name])
    result = evaluate_model(model, data.x_test, data.y_test, device=_device())
    metrics = MetricRecord({"num-examples": len(data.y_test), **result,
                            "client-id": pid, "server-round": server_round})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)
