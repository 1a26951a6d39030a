"""The ClientApp: a generic worker that runs the client half a message names.

Data and model come from the run config (``dataset``, ``partitioning``,
``data-dir``, ``seed``) and the node config (``partition-id``,
``num-partitions``); in a run over members' own data (``dataset =
"members"``) from the node config alone (``data-path``: the member's file or
folder, ``client-id``: its name), checked against the run config's schema
(:mod:`tasks.members`). What a train or evaluate message asks is a method's
business: the message names a client update under ``client-update``
(:mod:`strategies.core.client`; none named: plain local training), and this app
builds a :class:`strategies.core.client.ClientJob` (the received model, the
client's data, the message, the client's ``context.state``, the round's
seed and optimizer settings) and hands it over. It names no method.

train (reply: ``arrays`` and ``metrics`` with ``num-examples``, ``train-loss``,
    ``client-id``, ``server-round``, plus any records the update adds)
    The update trains the received model. Generic keys: ``local-epochs``,
    ``local-steps`` (> 0: that many mini-batch steps instead of epochs),
    ``batch-size``, ``learning-rate``, ``optimizer`` ("adam"/"sgd"), each defaulting
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
    many clients for the data, ...). A member says ``member`` (its name), its
    counts and its data's ``input-shape``, ``task`` and ``num-outputs``, or
    ``member`` and ``error``.

A message this client cannot carry out (an unknown client update, keys of two
methods) gets an error reply with code :data:`strategies.core.protocol.REFUSED`
naming the keys; the server stops the run on it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.supercore import log

import tasks
from strategies.core.client import (
    CLIENT_UPDATES,
    ClientJob,
    ClientUpdate,
    Optim,
    instruction_problem,
    update_name,
)
from strategies.core.layout import record, state_dict
from strategies.core.protocol import (
    ACCURACY,
    ALONE_LINEAR,
    ALONE_MODEL,
    ARRAYS,
    CHALLENGE,
    CLIENT_ID,
    CLIENT_INDEX,
    CONFIG,
    DECLINED,
    DP_EPSILON,
    DP_RUN,
    ERROR,
    FEATURE_COUNT,
    FEATURE_M2,
    FEATURE_MEAN,
    FEATURE_ROW_MEAN,
    FEATURE_STD,
    HELD_OUT_GAIN,
    INFO,
    INPUT_SHAPE,
    KEPT_MODEL,
    LOCAL_EPOCHS,
    LOCAL_STEPS,
    LOSS,
    MEMBER,
    MEMBER_KEY,
    METRICS,
    MODEL_KEPT,
    MSE,
    NUM_EXAMPLES,
    NUM_OUTPUTS,
    NUM_PARTITIONS,
    NUM_TEST,
    NUM_TRAIN,
    PROOF,
    QUERY,
    QUERY_LEFT_OUT,
    REFUSED,
    SAVE_MODEL,
    SERVER_ROUND,
    TASK_KIND,
    TRAIN_LOSS,
    as_float,
    as_int,
    is_name,
)
from strategies.core.records import score_of
from strategies.core.registry import STRATEGIES
from tasks.dp import DPSGD, os_generator, privatize_update
from tasks.scenarios import flip_labels
from tasks.scores import goodness
from tasks.tabular import (
    LEAST_ROWS,
    column_stats,
    fit_linear,
    folded,
    scaling_problem,
    standardize,
)
from tasks.tabular import own as own_stats
from tasks.train import evaluate as evaluate_model
from tasks.train import num_steps
from tasks.train import train as train_model

from . import identity
from .cards import MODEL_DIR
from .config import ConfigError, RunConfig
from .identity import IdentityError
from .member import member_choice
from .member.keeping import keep_tested_model
from .member.ledger import MAX_EPSILON, Declined, Ledger, NodePrivacy, data_digest
from .member.member_choice import Choice
from .sizes import check_client_memory

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


#: The node config keys of a member (``dataset = "members"``).
DATA_PATH, MEMBER_NAME = "data-path", "client-id"


def member_identity(context: Context) -> tuple[str, str]:
    """A member's name and data path from its node config, checked (ConfigError names the key)."""
    values = []
    for key, what in ((MEMBER_NAME, "the member's name: letters, digits and - _ . @, at most 64"),
                      (DATA_PATH, "the path of the member's data file or image folder")):
        value = context.node_config.get(key)
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(
                f"node config '{key}' = {value!r} is invalid; allowed: {what} (start the "
                "SuperNode with --node-config \"data-path='/site/data.npz' client-id='site-3'\")")
        values.append(value.strip())
    name, path = values
    if not is_name(name):
        raise ConfigError(f"node config '{MEMBER_NAME}' = {name!r} is invalid; allowed: letters, "
                          "digits and - _ . @ (at most 64)")
    return name, path


@dataclass(frozen=True)
class Setup:
    """What a message needs of this node: the run config, its partition id (-1 for a member,
    whose client id the server gives in every message), its data config and data, its name."""

    cfg: RunConfig
    partition_id: int
    dc: tasks.DataConfig
    data: tasks.ClientData
    name: str
    #: a member's standardizing statistics (its vector inputs are standardized by them)
    scaling: dict | None = None
    #: a member's own rule for the model it keeps (:mod:`.member_choice`), and the training
    #: rows it holds out for it (inputs, targets; None: none held out)
    choice: Choice | None = None
    held: tuple[torch.Tensor, torch.Tensor] | None = None


@functools.lru_cache(maxsize=8)
def _checked(items: tuple[tuple[str, Any], ...]) -> RunConfig:
    """:meth:`RunConfig.from_run_config` of a run config's items, once per process and run
    config: the in-process engine's messages (hundreds a round, each the same run config)
    checked it every time (1.3 s a round of 207 clients' two messages, under cProfile). An
    error is not kept: a bad run config is checked, and refused, again each time."""
    return RunConfig.from_run_config(dict(items))


def _run_config(context: Context) -> RunConfig:
    """The node's typed run config (:func:`_checked`; a value that cannot be a key of the
    cache, which Flower's scalar values never are, is checked without it)."""
    items = tuple(sorted(context.run_config.items()))
    try:
        hash(items)
    except TypeError:
        return RunConfig.from_run_config(context.run_config)
    return _checked(items)


def _setup(context: Context) -> Setup:
    """Validate the configs and load this client's data; errors name the key (or the file)."""
    cfg = _run_config(context)
    if cfg.dataset == tasks.MEMBERS:
        name, path = member_identity(context)
        dc = cfg.data_config(0, member=name, data_path=path)
        assert dc.schema is not None
        # its own rule for the model it keeps, checked before anything runs; nothing to
        # choose where no model is written (save-models = "none", or no model-dir here)
        choice = Choice.of(dict(context.node_config), dc.schema.kind, dc.schema.num_outputs)
        folder = context.node_config.get(MODEL_DIR)
        if cfg.save_models == "none" or not (isinstance(folder, str) and folder.strip()):
            choice = dataclasses.replace(choice, on=False)
        try:
            data = tasks.load_client_data(dc, 0)
        except tasks.MemberDataError as err:
            raise ConfigError(f"node config '{DATA_PATH}' = {path!r}: {err}") from None
        return _held_out(context, Setup(cfg, -1, dc, data, name, choice=choice))
    partition, n = _ids(context)
    if not 0 <= partition < n:
        raise ConfigError(f"node config 'partition-id' = {partition} is outside [0, num-partitions={n})")
    dc = cfg.data_config(n)
    if cfg.attack_ratio > 0 and tasks.data_info(dc).kind == tasks.REGRESSION:
        raise ConfigError(f"run config 'attack-ratio' = {cfg.attack_ratio} is invalid for the "
                          f"regression data of {cfg.dataset!r}; allowed: 0")
    try:
        data = tasks.load_client_data(dc, partition)
    except FileNotFoundError as err:
        raise ConfigError(cfg.data_dir_problem(err)) from None
    except tasks.ClientCountError as err:
        raise ConfigError(str(err)) from None
    except ValueError as err:
        setting = (f"'dataset' = {cfg.dataset!r}" if tasks.get_task(cfg.dataset).federated
                   else f"'dataset' = {cfg.dataset!r}, 'partitioning' = {cfg.partitioning!r}")
        raise ConfigError(f"run config {setting} with num-partitions = {n} clients: {err}") from None
    return Setup(cfg, partition, dc, data, str(partition))


def _held_out(context: Context, setup: Setup) -> Setup:
    """A member's setup with its held-out rows taken from its training rows, where its rule
    chooses its model on them (:func:`member_choice.held_out`); where it has too few rows
    to, it keeps the federated model, and its log says so once."""
    choice, d = setup.choice, setup.data
    if choice is None or not choice.on:
        return setup
    rows = member_choice.held_out(len(d.y_train), choice.fraction, setup.name)
    if rows is None:
        if _TOO_FEW not in context.state.config_records:
            context.state[_TOO_FEW] = ConfigRecord({"told": True})
            log(logging.WARNING, "This member has %d training rows, too few to hold out %d "
                "to choose its model on and train on the rest: it keeps the federated model, "
                "whatever it scores (node config '%s' = %s)", len(d.y_train),
                member_choice.LEAST_HELD, member_choice.KEEP, "better")
        return dataclasses.replace(setup, choice=dataclasses.replace(choice, on=False))
    held, rest = rows
    if _HELD_TOLD not in context.state.config_records:
        context.state[_HELD_TOLD] = ConfigRecord({"told": True})
        log(logging.INFO, "This member holds out %d of its %d training rows (node config "
            "'%s' = %g): the run never trains on them; the model it takes home is chosen on them "
            "(node config '%s' = \"federated\": every row trains, the run's model is kept)",
            len(held), len(d.y_train), member_choice.HELD_OUT_FRACTION, choice.fraction,
            member_choice.KEEP)
    data = tasks.ClientData(d.x_train[rest], d.y_train[rest], d.x_test, d.y_test)
    return dataclasses.replace(setup, data=data, held=(d.x_train[held], d.y_train[held]))


_TOO_FEW, _HELD_TOLD = "member-too-few-to-hold-out", "member-told-held-out"


def _seed(cfg: RunConfig, server_round: int, client_id: int) -> int:
    """Seed of a client's mini-batch order (and random labels) in a round."""
    return cfg.seed * 100_003 + server_round * 1_009 + client_id


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Say who this client is (and, a member, what its data looks like), or why it cannot
    take part; a member proves its name with its key (:func:`_proof`)."""
    members = context.run_config.get("dataset") == tasks.MEMBERS
    asked = msg.content.config_records.get(CONFIG)
    if asked is not None and asked.get(QUERY) == QUERY_LEFT_OUT:  # the server's word, in our log
        said = asked.get(ERROR)
        log(logging.WARNING, "The run leaves this node out: %s",  # one line, printable
            said[:2000].encode("unicode_escape").decode("ascii") if isinstance(said, str)
            else "(no reason given)")
        return Message(RecordDict({INFO: ConfigRecord({})}), reply_to=msg)
    try:
        setup = _setup(context)
        counts = {NUM_TRAIN: len(setup.data.y_train), NUM_TEST: len(setup.data.y_test)}
        if members:
            info = {MEMBER: setup.name, **counts, **_data_schema(setup),
                    **_column_stats(setup)}
        else:
            info = {CLIENT_ID: setup.partition_id, NUM_PARTITIONS: setup.dc.num_clients, **counts}
    except Exception as err:  # reported to the server, which leaves the client out or stops
        reason = f"{type(err).__name__}: {err}"
        # and said here, in the node's own log: a member sees why its data cannot take part
        log(logging.WARNING, "This node cannot take part in the run: %s", reason)
        if members:
            name = context.node_config.get(MEMBER_NAME)
            info = {MEMBER: name if isinstance(name, str) else "?", ERROR: reason}
        else:
            partition = context.node_config.get("partition-id", -1)
            info = {CLIENT_ID: partition if isinstance(partition, int) else -1, ERROR: reason}
    if members and is_name(info[MEMBER]):
        try:
            info.update(_proof(msg, context, str(info[MEMBER])))
        except (ConfigError, IdentityError, OSError, ValueError) as err:
            reason = f"{type(err).__name__}: {err}"
            log(logging.WARNING, "This node cannot prove its member name: %s", reason)
            info[ERROR] = reason
    return Message(RecordDict({INFO: ConfigRecord(info)}), reply_to=msg)


def _proof(msg: Message, context: Context, name: str) -> dict[str, bytes]:
    """This member's public key and its signature over the server's challenge, its name and
    its node id (the app's identity module); the key is made on the node's first run."""
    challenge = msg.content.config_records[CONFIG].get(CHALLENGE)
    if not isinstance(challenge, bytes) or len(challenge) != identity.CHALLENGE_BYTES:
        raise ValueError(f"the query carries no challenge of {identity.CHALLENGE_BYTES} bytes "
                         "(a server of another version of this app?)")
    key = identity.member_key(identity.identity_dir(context.node_config), name)
    return {MEMBER_KEY: identity.public_bytes(key),
            PROOF: identity.sign(key, challenge, name, context.node_id)}


def _vector_member(setup: Setup) -> bool:
    """Whether this node is a member whose inputs are vectors (a table, an .npz of vectors):
    the inputs that are standardized (tasks/tabular.py)."""
    return setup.partition_id < 0 and setup.data.x_train.dim() == 2


def _column_stats(setup: Setup) -> dict:
    """What a member tells the server of its training rows for the pooled standardizing
    statistics: their count and per-column means and centred sums of squares
    (member-scaling = "pooled"; nothing under dp, or with fewer than LEAST_ROWS rows,
    where the member uses the others' pooled statistics, or its own if none are)."""
    cfg = setup.cfg
    if (not _vector_member(setup) or cfg.member_scaling != "pooled" or cfg.dp != "none"
            or len(setup.data.x_train) < LEAST_ROWS):
        return {}
    n, means, m2 = column_stats(setup.data.x_train)
    return {FEATURE_COUNT: n, FEATURE_ROW_MEAN: means, FEATURE_M2: m2}


def _scaled(setup: Setup, config: ConfigRecord) -> tuple[Setup, dict | None]:
    """A member's vector data standardized as the run says (member-scaling): by the pooled
    statistics its messages carry, else by its own training rows'; and the statistics (for
    its model's card). Other data as they are (None)."""
    cfg = setup.cfg
    if not _vector_member(setup) or cfg.member_scaling == "none":
        return setup, None
    features = setup.data.x_train.shape[1]
    mean, std = config.get(FEATURE_MEAN), config.get(FEATURE_STD)
    if cfg.member_scaling == "pooled" and mean is not None:
        problem = scaling_problem(mean, std, features)
        if problem is not None:
            raise ConfigError(f"message config '{FEATURE_MEAN}'/'{FEATURE_STD}': {problem}")
        source = "pooled over the members' training rows"
    else:
        mean, std = own_stats(setup.data.x_train)
        source = "this member's own training rows"
    assert isinstance(mean, list) and isinstance(std, list)
    means, stds = [float(v) for v in mean], [float(v) for v in std]
    d = setup.data
    data = tasks.ClientData(standardize(d.x_train, means, stds), d.y_train,
                            standardize(d.x_test, means, stds), d.y_test)
    held = (None if setup.held is None
            else (standardize(setup.held[0], means, stds), setup.held[1]))
    return (dataclasses.replace(setup, data=data, held=held),
            {"mean": means, "std": stds, "from": source,
             "columns": (setup.dc.schema.input_names(setup.dc.schema.feature_columns)
                         if setup.dc.schema else [])})


def _data_schema(setup: Setup) -> dict:
    """What a member's data looks like (the server checks it against the run's schema)."""
    d = setup.data
    regression = torch.is_floating_point(d.y_train)
    outputs = (int(d.y_train[0].numel()) if regression
               else int(max(int(d.y_train.max()), int(d.y_test.max())) + 1))
    return {INPUT_SHAPE: ",".join(str(int(v)) for v in d.x_train.shape[1:]),
            TASK_KIND: tasks.REGRESSION if regression else tasks.CLASSIFICATION,
            NUM_OUTPUTS: outputs}


def _job(msg: Message, context: Context,
         train: bool) -> tuple[ClientUpdate, ClientJob, int, Setup]:
    """The client update the message names (checked: :func:`instruction_problem`) and its job."""
    c = msg.content.config_records[CONFIG]
    setup, scaling = _scaled(_setup(context), c)
    cfg, dc, data = setup.cfg, setup.dc, setup.data
    client_id = _client_index(c, setup)
    server_round = as_int(c.get(SERVER_ROUND, 0), SERVER_ROUND)
    seed = _seed(cfg, server_round, client_id)
    targets = data.y_train
    attackers = cfg.roles(dc.num_clients).attackers  # attack-ratio
    if train and setup.partition_id >= 0 and client_id in attackers:
        classes = tasks.data_info(dc).num_outputs
        targets = flip_labels(data.y_train, classes, torch.Generator().manual_seed(seed))
    run = cfg.training()  # what the message does not say
    optim = Optim.from_message(c, run, _device())  # bounded: instruction_problem
    batch = min(optim.batch_size, len(data.y_train))
    if batch > int(cfg.batch_size):  # the memory it will use for it
        check_client_memory(dataclasses.replace(cfg, batch_size=batch))
    model = tasks.model_for(dc, cfg.model)  # built once per process, then reused
    model.load_state_dict(state_dict(msg.content.array_records[ARRAYS]))
    update = CLIENT_UPDATES[update_name(c)]
    job = ClientJob(model=model, data=data, targets=targets, content=msg.content, config=c,
                    state=context.state, server_round=server_round, seed=seed,
                    epochs=as_int(c.get(LOCAL_EPOCHS, run[LOCAL_EPOCHS]), LOCAL_EPOCHS),
                    steps=as_int(c.get(LOCAL_STEPS, run[LOCAL_STEPS]), LOCAL_STEPS), optim=optim,
                    settings=update.settings.from_message(c), run_seed=cfg.seed,
                    client_id=client_id)
    return update, job, client_id, dataclasses.replace(setup, scaling=scaling)


def _client_index(config: ConfigRecord, setup: Setup) -> int:
    """The client's id in the run: its partition id, or, a member, the one the server gives."""
    index = config.get(CLIENT_INDEX, setup.partition_id)
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ConfigError(f"message config '{CLIENT_INDEX}' = {index!r} is invalid; allowed: "
                          "an integer >= 0 (the server gives every member its index)")
    if setup.partition_id >= 0 and index != setup.partition_id:
        raise ConfigError(f"message config '{CLIENT_INDEX}' = {index} is not this node's "
                          f"partition-id {setup.partition_id}")
    return index


def _refusal(msg: Message, reason: str) -> Message:
    return Message(Error(code=REFUSED, reason=reason), reply_to=msg)


def _metrics(job: ClientJob, client_id: int, **values) -> MetricRecord:
    return MetricRecord({**values, CLIENT_ID: client_id, SERVER_ROUND: job.server_round})


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Run the named client update on the received model; reply the trained model."""
    problem = instruction_problem(msg.content.config_records[CONFIG], train=True)
    if problem is not None:
        return _refusal(msg, problem)
    update, job, client_id, setup = _job(msg, context, train=True)
    try:
        private = _private(context, setup, job)
    except Declined as err:  # this member's own rule: its absence this round, with why
        log(logging.WARNING, "This node declines round %d: %s", job.server_round, err)
        return Message(Error(code=DECLINED, reason=str(err)), reply_to=msg)
    noised_update = private is not None and private[0].mode == "update"
    received = ({k: v.detach().cpu().clone() for k, v in job.model.state_dict().items()}
                if noised_update else {})
    if private is not None and private[0].mode == "dp-sgd":
        job.dp_sgd = DPSGD(private[0].clip, private[0].noise_multiplier,
                           _sample_rate(job), os_generator())
    loss, records = update.train(job)
    taken = {ARRAYS, METRICS} & set(records)
    if taken:
        raise ValueError(f"client update {update.name!r} returned records named {sorted(taken)}, "
                         "which the reply uses itself")
    said = {}
    # copied to the host tensor by tensor: the model stays where it trains, for the next message
    state: dict[str, torch.Tensor] = OrderedDict(
        (k, v.detach().cpu()) for k, v in job.model.state_dict().items())
    if private:
        privacy, ledger = private
        if records:  # the registry refuses such a method before any work; never sent unnoised
            raise ValueError(f"dp = {privacy.mode!r}: client update {update.name!r} replies the "
                             f"records {sorted(records)}, which are not made private")
        if noised_update:
            state, _ = privatize_update(received, state, privacy.clip,
                                        privacy.noise_multiplier, os_generator())
        elif job.dp_sgd is not None and job.dp_sgd.steps_taken == 0 and _release(
                privacy, job)[0] > 0:  # trained, but not by the generic loop: never sent
            raise ValueError(f"dp = 'dp-sgd': client update {update.name!r} trained without "
                             "the generic loop's DP-SGD; its reply is not sent")
        try:
            steps, rate = ((job.dp_sgd.steps_taken, job.dp_sgd.sample_rate)
                           if job.dp_sgd is not None else _release(privacy, job))
            said[DP_EPSILON] = ledger.spend(
                privacy, str(job.config.get(DP_RUN, "")), job.server_round, steps, rate,
                # the member's own data (not a scenario's flipped labels)
                data_digest(job.data.x_train, job.data.y_train))
        except Declined as err:  # checked before training; the budget changed since
            log(logging.WARNING, "This node declines round %d: %s", job.server_round, err)
            return Message(Error(code=DECLINED, reason=str(err)), reply_to=msg)
    # under dp the training loss (computed on the private data, unnoised) stays here
    loss_said = {} if private else {TRAIN_LOSS: loss}
    metrics = _metrics(job, client_id, **{NUM_EXAMPLES: len(job.data.y_train)}, **loss_said,
                       **said)
    arrays = record(state)
    return Message(RecordDict({ARRAYS: arrays, METRICS: metrics, **records}), reply_to=msg)


def _sample_rate(job: ClientJob) -> float:
    """DP-SGD's Poisson sampling rate: the batch size over the client's examples."""
    return min(1.0, job.optim.batch_size / max(len(job.data.y_train), 1))


def _release(privacy: NodePrivacy, job: ClientJob) -> tuple[int, float]:
    """The Gaussian mechanisms a reply runs, as the accountant counts them: (steps, sample
    rate). A noised update: one, on all the data; DP-SGD: each of its steps on a sample."""
    if privacy.mode == "dp-sgd":
        return num_steps(len(job.data.y_train), job.optim.batch_size, job.epochs,
                         job.steps), _sample_rate(job)
    return 1, 1.0


def _private(context: Context, setup: Setup, job: ClientJob
             ) -> tuple[NodePrivacy, Ledger] | None:
    """This round's privacy (None: the reply is not noised), or :class:`Declined` where this
    node will not train: its own rules (:meth:`NodePrivacy.check`), or a reply that would
    take its epsilon past its limit (checked before training, spent after)."""
    if setup.cfg.dp == "none" and MAX_EPSILON not in context.node_config:
        return None  # no privacy asked, none required: the node config's dp-* keys unread
    privacy = NodePrivacy.of(context, setup.cfg, str(job.config.get(DP_RUN, "")),
                             member=setup.partition_id < 0)
    privacy.check()
    if privacy.mode == "none":
        return None
    assert privacy.ledger_dir is not None  # check() declines a node without one
    ledger = Ledger(privacy.ledger_dir, setup.name)
    ledger.would_spend(privacy, *_release(privacy, job))  # before training, not after
    return privacy, ledger


_ALONE, _ALONE_MODEL = "member-alone", "member-alone-model"
#: a member's linear model alone, on the run's inputs (:func:`tasks.tabular.folded`)
_ALONE_LINEAR = "member-alone-linear"


def _guarded(setup: Setup) -> bool:
    """Whether this node is a member that chooses the model it keeps (:mod:`.member_choice`)."""
    return setup.choice is not None and setup.choice.on and setup.held is not None


def _alone(context: Context, setup: Setup, job: ClientJob, scores: dict) -> dict:
    """What this client scores alone on the same test rows, with the same inputs, after the
    same local work (:func:`_alone_now`), beside its federated score: said in a member's own
    log. Empty where ``alone`` is false (by default: but for members' tables and the
    synthetic task) and this node is not a member that chooses its model on held-out rows
    (:mod:`.member_choice`: it needs the models alone)."""
    if setup.cfg.alone is not True and not _guarded(setup):
        return {}
    with torch.random.fork_rng(devices=[]):  # its training touches no one's random state
        held = _alone_now(context, setup, job)
    main = str(held["metric"])
    mine = float(scores[main])
    model_score = as_float(held["model"], "model")
    linear_score = as_float(held["linear"], "linear") if "linear" in held else None
    accuracy = main == ACCURACY
    gain = score_of(not accuracy).gain(mine, [v for v in (linear_score, model_score)
                                              if v is not None])
    alone: dict[str, Any] = {"model": model_score, "metric": main,
                             "steps": as_int(held["steps"], "steps"), "gain": gain,
                             **({"linear": linear_score} if linear_score is not None else {})}
    if setup.partition_id >= 0:  # a simulated client: the server's closing lines say it
        return alone
    scale, unit = (100.0, " points") if accuracy else (1.0, "")
    linear_said = "" if linear_score is None else f"the linear model {scale * linear_score:.4g} and "
    # the model it keeps is chosen on held-out rows, and said there (_choose); here, how the
    # run's model does on the test rows, round by round
    log(logging.INFO,
        "Round %d: this member's model %s %.4g on its %d test rows; alone, %sthe run's model "
        "%.4g (%d steps): %+.3g%s%s", job.server_round, main, scale * mine,
        len(job.data.y_test), linear_said, scale * model_score, alone["steps"], scale * gain,
        unit, "" if gain >= 0 or not STRATEGIES[setup.cfg.strategy].federates else
        ": federation does worse on these rows than its better model alone")
    return alone


def _alone_now(context: Context, setup: Setup, job: ClientJob) -> ConfigRecord:
    """This client's scores alone after the run's rounds so far: the run's own model, from
    the run's initial model, trained on its training rows for the local work of every round
    up to this one (at each evaluation, the rounds' steps since the one before, with a fresh
    optimizer, as the no-federation baseline trains; kept in ``context.state``, so that no
    round pays for more than its own), and, for vector inputs, the standardized linear model
    (tasks/tabular.py), fitted once; both tested on its test rows. Both models are kept in
    ``context.state``, for the member's choice (:func:`_choose`)."""
    cfg, data = setup.cfg, job.data
    held = context.state.config_records.get(_ALONE)
    last = as_int(held["round"], "round") if held is not None and "round" in held else 0
    if held is not None and last >= job.server_round:
        return held  # this round's already
    done = as_int(held["steps"], "steps") if held is not None and "steps" in held else 0
    per_round = num_steps(len(data.y_train), job.optim.batch_size, job.epochs, job.steps)
    # (no more rounds than the run has: a message's round number alone sets no budget)
    now = min(job.server_round, int(cfg.num_server_rounds))
    target = done + per_round * max(now - last, 0)
    if setup.dc.schema is not None:
        kind, classes = setup.dc.schema.kind, setup.dc.schema.num_outputs
    else:
        info = tasks.data_info(setup.dc)
        kind, classes = info.kind, info.num_outputs  # (a regression's: its outputs)
    with torch.random.fork_rng(devices=[]):  # nobody else's random state is touched
        torch.default_generator.manual_seed(cfg.seed)  # the run's initial model, as the
        model = tasks.build_model(setup.dc, cfg.model)  # server builds it (on the CPU)
    stored = context.state.array_records.get(_ALONE_MODEL)
    if stored is not None and done:
        model.load_state_dict(state_dict(stored))
    train_model(model, data.x_train, data.y_train, epochs=0, steps=target - done,
                **job.optim.loop_kwargs(), seed=_seed(cfg, job.server_round, 0))
    context.state[_ALONE_MODEL] = ArrayRecord(
        OrderedDict((k, v.detach().cpu()) for k, v in model.state_dict().items()))
    main = ACCURACY if kind != tasks.REGRESSION else MSE
    result = evaluate_model(model, data.x_test, data.y_test, device=_device())
    values = {"model": float(result.accuracy if main == ACCURACY else result.mse)}  # type: ignore[arg-type]
    if held is not None and "linear" in held:
        values["linear"] = as_float(held["linear"], "linear")
    elif data.x_train.dim() == 2:  # vectors: the linear model, on its own statistics, once
        mean, std = own_stats(data.x_train)
        with torch.random.fork_rng(devices=[]):  # (building it draws from the RNG)
            linear = folded(fit_linear(standardize(data.x_train, mean, std), data.y_train,
                                       classes), mean, std)  # on the run's inputs
        context.state[_ALONE_LINEAR] = ArrayRecord(
            OrderedDict((k, v.detach().cpu()) for k, v in linear.state_dict().items()))
        result = evaluate_model(linear, data.x_test, data.y_test, device=_device())
        values["linear"] = float(result.accuracy if main == ACCURACY else result.mse)  # type: ignore[arg-type]
    held = context.state[_ALONE] = ConfigRecord({**values, "metric": main, "steps": target,
                                                 "round": job.server_round})
    return held


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Test the model that the named client update makes of the received one."""
    problem = instruction_problem(msg.content.config_records[CONFIG], train=False)
    if problem is not None:
        return _refusal(msg, problem)
    update, job, client_id, setup = _job(msg, context, train=False)
    tested = update.evaluate(job)
    result = evaluate_model(tested, job.data.x_test, job.data.y_test, device=_device(),
                            stackable=True)
    scores = {LOSS: result.loss, **({ACCURACY: result.accuracy} if result.accuracy is not None
                                     else {MSE: result.mse})}
    scores[NUM_EXAMPLES] = len(job.data.y_test)
    alone = _alone(context, setup, job, scores)
    kept_model, kept_scores, choice = tested, scores, None
    if _guarded(setup) and SAVE_MODEL in job.config:  # the member's own rule
        with torch.random.fork_rng(devices=[]):  # the models it builds touch no one's RNG
            kept_model, choice = _choose(context, setup, job, tested)
        if kept_model is not tested:
            result = evaluate_model(kept_model, job.data.x_test, job.data.y_test,
                                    device=_device())
            kept_scores = {LOSS: result.loss, NUM_EXAMPLES: len(job.data.y_test),
                           **({ACCURACY: result.accuracy} if result.accuracy is not None
                              else {MSE: result.mse})}
    kept, said = keep_tested_model(
        context, setup.cfg, setup.dc, job.config, kept_model, client_id,
        setup.name if setup.partition_id < 0 else None, kept_scores,
        (job.data.x_test, job.data.y_test), standardize=setup.scaling,
        alone=alone if alone and setup.cfg.alone is True else None, choice=choice,
        model_name="linear" if choice and choice["kept"] == member_choice.LINEAR else None)
    if choice is not None and said.get(MODEL_KEPT):  # (written on this node)
        said[KEPT_MODEL] = member_choice.CODES[choice["kept"]]
        if choice["gain"] is not None and setup.cfg.dp == "none":  # (about training rows)
            said[HELD_OUT_GAIN] = choice["gain"]
    alone_said = {k: v for k, v in ((ALONE_LINEAR, alone.get("linear")),
                                    (ALONE_MODEL, alone.get("model")))
                  if v is not None and setup.cfg.alone is True}
    metrics = _metrics(job, client_id, **scores, **said, **alone_said)
    return Message(RecordDict({METRICS: metrics, **kept}), reply_to=msg)


_TOLD_WORSE = "member-told-federation-worse"


def _linear(setup: Setup, x: torch.Tensor, y: torch.Tensor) -> torch.nn.Module:
    """The linear model alone fitted on rows (x, y), on the run's inputs."""
    mean, std = own_stats(x)
    outputs = setup.dc.schema.num_outputs if setup.dc.schema else 0
    return folded(fit_linear(standardize(x, mean, std), y, outputs), mean, std)


def _model_alone(setup: Setup, job: ClientJob, x: torch.Tensor, y: torch.Tensor,
                 steps: int) -> torch.nn.Module:
    """The run's model trained alone on rows (x, y) from the run's initial model, for
    ``steps`` local steps (as many as its model alone has had), with the round's optimizer
    settings."""
    torch.default_generator.manual_seed(setup.cfg.seed)  # (within the caller's fork_rng)
    model = tasks.build_model(setup.dc, setup.cfg.model)
    train_model(model, x, y, epochs=0, steps=steps, **job.optim.loop_kwargs(),
                seed=_seed(setup.cfg, job.server_round, 1))
    return model


def _choose(context: Context, setup: Setup, job: ClientJob, tested: torch.nn.Module
            ) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The model this member keeps: the best on its held-out rows of its federated model and
    its models alone (:func:`member_choice.choose`), and the choice's record (its card's);
    said in its log, at WARNING once where federation does worse there."""
    assert setup.choice is not None and setup.held is not None
    candidates: dict[str, torch.nn.Module] = {member_choice.FEDERATED: tested}
    stored = context.state.array_records.get(_ALONE_LINEAR)
    if stored is not None:
        state = state_dict(stored)
        linear = tasks.MODELS["linear"]((state["net.0.weight"].shape[1],),
                                        state["net.0.weight"].shape[0])
        linear.load_state_dict(state)
        candidates[member_choice.LINEAR] = linear
    stored = context.state.array_records.get(_ALONE_MODEL)
    if stored is not None:
        model = tasks.build_model(setup.dc, setup.cfg.model)
        model.load_state_dict(state_dict(stored))
        candidates[member_choice.MODEL] = model
    # every training row, the held-out ones last
    x = torch.cat([job.data.x_train, setup.held[0]])
    y = torch.cat([job.data.y_train, setup.held[1]])
    final, cross = {}, {}
    if member_choice.LINEAR in candidates:  # refitted on every training row, held-out too
        final[member_choice.LINEAR] = _linear(setup, x, y)
        cross[member_choice.LINEAR] = member_choice.out_of_fold(
            lambda xf, yf: _linear(setup, xf, yf), x, y, setup.name)
    if member_choice.MODEL in candidates and x.dim() == 2:  # a table: cross-validated too
        steps = as_int(context.state.config_records[_ALONE]["steps"], "steps")
        cross[member_choice.MODEL] = member_choice.out_of_fold(
            lambda xf, yf: _model_alone(setup, job, xf, yf, steps), x, y, setup.name)
        final[member_choice.MODEL] = _model_alone(setup, job, x, y, steps)  # every row
    choice = {**member_choice.choose(candidates, setup.held, (job.data.x_test,
                                                              job.data.y_test),
                                     setup.choice.metric, final, cross, y),
              "held_out_fraction": setup.choice.fraction}
    log(logging.INFO, "Round %d: the model this member keeps, chosen by %s", job.server_round,
        member_choice.said(choice))
    if choice["kept"] != member_choice.FEDERATED and _TOLD_WORSE not in \
            context.state.config_records:
        context.state[_TOLD_WORSE] = ConfigRecord({"told": True})
        log(logging.WARNING, "This member's federated model %s the '%s' model on its held-out "
            "rows (%s): it takes home the '%s' model (node config '%s' = \"federated\" keeps "
            "the federated model instead)", "does not lead" if goodness(
                choice["held_out"][member_choice.FEDERATED], choice["metric"]) > goodness(
                choice["held_out"][choice["kept"]], choice["metric"]) else "scores below",
            choice["kept"],
            member_choice.said(choice).split("; kept")[0], choice["kept"], member_choice.KEEP)
    return {**candidates, **final}[choice["kept"]], choice
