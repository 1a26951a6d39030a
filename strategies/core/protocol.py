"""The message vocabulary that both halves of every method share.

Keys that every message or reply may carry live here, once; a method's own
keys (SCAFFOLD's ``control``, APFL's ``apfl-alpha``, ...) live in that
method's module, beside both of its halves. No key is spelled out in two files.

Records of a message (``RecordDict`` names)
    ``config`` (ConfigRecord), ``arrays`` (ArrayRecord: the model),
    ``metrics`` (MetricRecord: in replies), ``info`` (ConfigRecord: the query reply),
    ``model`` (ArrayRecord: the tested model, in an evaluate reply asked to keep it).
Config keys every train / evaluate message may carry
    ``server-round``, ``client-update`` (the name of the client half to run,
    :mod:`strategies.core.client`), ``client-index`` (the client's id in the run),
    ``local-epochs``, ``local-steps``, ``batch-size``, ``learning-rate``, ``optimizer``
    (:data:`TRAINING_KEYS`, the run config's keys under their own names);
    in train messages ``trained-rounds``; in evaluate messages of a round whose models
    are kept ``save-model``, ``save-token``, ``save-reason`` and ``save-if-better``.
Reply metrics
    ``client-id``, ``server-round``, ``num-examples``, ``train-loss``;
    evaluation: ``accuracy`` (classification) or ``mse`` (regression), and ``loss``.
Query reply (``info``)
    ``client-id``, ``num-partitions``, ``num-train``, ``num-test``, or ``error``;
    a member of a run over members' own data says ``member`` (its name, the node
    config's ``client-id``), ``num-train``, ``num-test`` and its data's
    ``input-shape``, ``task`` and ``num-outputs``, or ``member`` and ``error``.
"""

from __future__ import annotations

# Records of a message
CONFIG = "config"
ARRAYS = "arrays"
METRICS = "metrics"
INFO = "info"

# Config keys of train / evaluate messages
SERVER_ROUND = "server-round"
CLIENT_UPDATE = "client-update"
LOCAL_EPOCHS = "local-epochs"
LOCAL_STEPS = "local-steps"
BATCH_SIZE = "batch-size"
LEARNING_RATE = "learning-rate"  # the run config's key, under its own name
OPTIMIZER = "optimizer"
#: the run config's local-training keys: every train message carries them under these names,
#: the run's values (:meth:`fedamp_flwr.config.RunConfig.training`); a member reads them
#: back (:meth:`strategies.core.client.Optim.from_message`), its own run config's where
#: a message has none
TRAINING_KEYS = (LOCAL_EPOCHS, LOCAL_STEPS, BATCH_SIZE, LEARNING_RATE, OPTIMIZER)
# In train messages: in how many earlier rounds this client's training was used. A
# client that keeps state across rounds and finds none although this is > 0 has lost
# it (a restarted SuperNode starts with an empty context.state) and says so.
TRAINED_ROUNDS = "trained-rounds"
# The client's id in the run (its partition id; a member's, given by the server in the
# order of the members' names): seeds the client's mini-batch order.
CLIENT_INDEX = "client-index"
# In evaluate messages of the rounds whose models are kept (run config save-models): the
# run's name and token (a member's node never overwrites another run's files), why the
# model is kept, and, keeping the best validation model, the client's best score of the
# earlier rounds (keep only a better one). The node writes the tested model to its
# model-dir, or (a partitioned run) replies it under MODEL for the server to write.
SAVE_MODEL = "save-model"
SAVE_TOKEN = "save-token"
SAVE_REASON = "save-reason"
SAVE_IF_BETTER = "save-if-better"
MODEL = "model"
# In those evaluate messages too, for a method that mixes models by weights (FedAMP's xi row,
# SFL's smoothing, Panacea's graph propagation): the clients whose models weighed most in this
# client's, most first (members by name, others by client id), their weights, and the weight
# of the client's own. Names and weights only: never another member's data or scores.
LEARNED_FROM, LEARNED_WEIGHTS, LEARNED_SELF = ("learned-from", "learned-from-weights",
                                               "learned-from-self")
# In those evaluate messages too: how the client's model started, for its card: a warm
# start's run, round and checkpoint sha256 (run config warm-start), and the start itself
# ("its own model", "the mean of 2 returning members' models", ...).
WARM_RUN, WARM_ROUND, WARM_DIGEST, STARTED_FROM = ("warm-run", "warm-round", "warm-sha256",
                                                   "started-from")
# Reply metric of an evaluate reply asked to keep its model: 1 if the node wrote it to its
# model-dir, 0 if it did not (no model-dir, another run's files there, a failed write).
MODEL_KEPT = "model-kept"
# In train messages of a run with differential privacy (run config dp): the run's folder,
# absolute (a partitioned run's clients keep their privacy ledger in its privacy/; a
# member's node keeps its own in its privacy-dir, fedamp_flwr/member/ledger.py).
DP_RUN = "dp-run"
# Train reply metric under dp: the epsilon the member has spent, this reply included, over
# every run its ledger holds (at the run's dp-delta, or its node's stricter one).
DP_EPSILON = "dp-epsilon"
# A member's vector inputs, standardized (tasks/tabular.py): its query answer gives its
# training rows' count and per-column means and centred sums of squares; train and
# evaluate messages carry the run's pooled mean and standard deviation per column.
FEATURE_COUNT, FEATURE_ROW_MEAN, FEATURE_M2 = "feature-count", "feature-row-mean", "feature-m2"
FEATURE_MEAN, FEATURE_STD = "feature-mean", "feature-std"
# Evaluate reply metrics of a member: what it scores alone on the same test rows (the
# standardized linear model, the run's model trained alone for the run's budget).
ALONE_LINEAR, ALONE_MODEL = "alone-linear", "alone-model"
# ... and the model it took home by its own rule (fedamp_flwr/member/member_choice.py): 0 its
# federated model, 1 its linear model alone, 2 the run's model alone; and its federated
# model's score on its held-out rows against the best alone's (positive: federation better)
KEPT_MODEL, HELD_OUT_GAIN = "kept-model", "held-out-gain"
KEPT_NAMES = ("federated", "linear alone", "model alone")  # by kept-model's code
# In those evaluate messages too, where the run inferred its client graph (graph = "inferred"):
# the client's neighbours in it (members by name, others by client id) and whether the run
# uses it (a short line: used, on trial, or not used and why). Names only.
GRAPH_EDGES, GRAPH_USED = "graph-edges", "graph-used"
GENERIC_KEYS = frozenset({SERVER_ROUND, CLIENT_UPDATE, LOCAL_EPOCHS, LOCAL_STEPS, BATCH_SIZE,
                          LEARNING_RATE, OPTIMIZER, TRAINED_ROUNDS, CLIENT_INDEX, SAVE_MODEL, SAVE_TOKEN,
                          SAVE_REASON, SAVE_IF_BETTER, DP_RUN, FEATURE_MEAN, FEATURE_STD,
                          LEARNED_FROM, LEARNED_WEIGHTS, LEARNED_SELF, WARM_RUN, WARM_ROUND,
                          WARM_DIGEST, STARTED_FROM, GRAPH_EDGES, GRAPH_USED})

# Reply metrics
CLIENT_ID = "client-id"
NUM_EXAMPLES = "num-examples"
TRAIN_LOSS = "train-loss"
ACCURACY = "accuracy"
MSE = "mse"
LOSS = "loss"

# The query round
QUERY = "query"
QUERY_CLIENT_INFO = "client-info"
#: a query that tells a node why the run leaves it out (under ``error``); its ClientApp logs
#: it in the node's own log and answers with an empty ``info``
QUERY_LEFT_OUT = "left-out"
NUM_PARTITIONS = "num-partitions"
NUM_TRAIN = "num-train"
NUM_TEST = "num-test"
ERROR = "error"
MEMBER = "member"
INPUT_SHAPE = "input-shape"
TASK_KIND = "task"
NUM_OUTPUTS = "num-outputs"
# A member proves its name (fedamp_flwr/identity.py): the query carries a fresh challenge,
# the answer the member's public key and its signature
CHALLENGE = "challenge"
MEMBER_KEY = "member-key"
PROOF = "proof"

# Error code of a reply in which a client refuses a message it cannot carry
# out (an unknown client update, keys of two methods in one message). Flower's
# own codes are small integers (flwr.common.constant.ErrorCode); the server
# stops the run on this one (:meth:`strategies.core.screening.ReplyScreen.stop_on_refusals`).
REFUSED = 1001
# Error code of a member's node that declines a round by its own rule (its privacy budget
# would be passed, fedamp_flwr/member/ledger.py): that member's absence, with the reason; never
# a reason to stop the run.
DECLINED = 1002
# Error code of the reply the server writes itself for a message that got none: within the
# round timeout, or none at all from the SuperLink (fedamp_flwr/server/discovery.py
# ``send_and_receive``): every message sent has exactly one reply, with a true reason.
NO_REPLY = 1003


def as_float(value: object, key: str) -> float:
    """A message's value of ``key`` as a float (a ValueError naming the key if it is no number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"message key '{key}' = {value!r} is not a number")
    return float(value)


def short_repr(value: object, most: int = 80) -> str:
    """A message value as an error may quote it: its repr, at most ``most`` characters."""
    text = repr(value)
    return text if len(text) <= most else text[:most - 3] + "..."


def as_int(value: object, key: str) -> int:
    """A message's value of ``key`` as an int (a ValueError naming the key if it is none)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"message key '{key}' = {value!r} is not an integer")
    return value

#: The characters of a member's name (its node config's ``client-id``, its query answer's
#: ``member``) and of a run's name.
NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.@")


def is_name(value: object, most: int = 64) -> bool:
    """Whether ``value`` is a name this app takes (a member's, a run's): 1 to ``most`` of the
    :data:`NAME_CHARS`, not ``.`` or ``..`` (a name is also a file or folder name)."""
    return (isinstance(value, str) and 0 < len(value) <= most and set(value) <= NAME_CHARS
            and value not in (".", ".."))
