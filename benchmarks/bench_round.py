"""One round of Fashion-MNIST practical, phase by phase, against its floor in the same process.

For each number of clients and each strategy, a fresh process runs the app in
process (the real ServerApp and ClientApp, ``fedamp_flwr.tools.inprocess``) for
``--rounds`` rounds of ``--local-steps`` Adam steps of the task's CNN per
client, and times every phase of each round after the first (the first reads
and partitions the data); the fastest of those rounds is reported:

* client training (the generic loop, ``tasks.train.train``),
* evaluation (``tasks.train.evaluate``),
* (de)serialisation (models into and out of Flower's ``ArrayRecord`` and the
  server's flat vectors),
* the server's strategy (sampling, FedAMP's weights and cloud models, the
  aggregation; without the (de)serialisation inside it),
* the checkpoint's copy in memory (its writing to disk runs beside the next
  round, on the run's writer thread; the benchmark waits for it before it times
  the floor, and reports the wait, ``write_wait`` in the JSON),
* the rest (the round minus all of the above: messages, configs, records).

Beside it, in the same process and on the same device, the floor: the same
number of optimizer steps (clients x local steps, Adam, batch 100) of the
same model in a plain PyTorch loop over the clients' data, already on the
device, timed ``--floor-repeats`` times after every round so that round and
floor meet the same load of the machine (the fastest is reported). It prints
seconds per phase and the ratio round / floor, and writes them as JSON
(``--out``).

    python -m benchmarks.bench_round [--clients 20 100] [--strategies fedavg fedamp]
        [--local-steps 5] [--rounds 2] [--data-dir ../shared/data/fashion_mnist]

Without ``--data-dir`` files it runs on the synthetic task (its MLP) instead.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from fedamp_flwr.server.results import strict_json

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
cfg, n, floor_rounds = json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
import torch
from flwr.app import ArrayRecord
import tasks, strategies
from fedamp_flwr import client_app
from fedamp_flwr.server import rounds, results
from fedamp_flwr.tools import inprocess
from strategies.core import layout, base

PHASES = ("training", "evaluation", "serialisation", "server", "checkpoint")
spent = {p: 0.0 for p in PHASES}
stack = []  # the phase running now, innermost last: time goes to the innermost

def timed(phase, fn):
    def wrapper(*args, **kwargs):
        now = time.perf_counter()
        if stack:
            spent[stack[-1][0]] += now - stack[-1][1]
        stack.append([phase, now])
        try:
            return fn(*args, **kwargs)
        finally:
            end = time.perf_counter()
            spent[phase] += end - stack.pop()[1]
            if stack:
                stack[-1][1] = end
    return wrapper

def patch(owner, name, phase):
    setattr(owner, name, timed(phase, getattr(owner, name)))

# the ClientApp calls the loops through these names
import strategies.core.client as core_client
core_client.train_loop = timed("training", core_client.train_loop)
client_app.evaluate_model = timed("evaluation", client_app.evaluate_model)
for name in ("__init__", "to_torch_state_dict"):
    patch(ArrayRecord, name, "serialisation")
for name in ("flatten", "unflatten"):
    patch(layout.FlatLayout, name, "serialisation")
for cls in (base.FlowerStrategy, base.PersonalRounds, base.PersonalizedStrategy,
            strategies.FedAMP):
    for name in ("configure_train", "aggregate_train", "configure_evaluate", "aggregate_evaluate"):
        if name in vars(cls):
            patch(cls, name, "server")
import fedamp_flwr.server.recorder as recorder
import fedamp_flwr.server_app as server_app
# the round's part of a checkpoint: the copy in memory (the writer's thread writes it while
# the next round runs, off the round's path)
recorder.snapshot = timed("checkpoint", recorder.snapshot)

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

# the floor: the same optimizer steps of the same model, data already on the device
rc = client_app.RunConfig.from_run_config(cfg)
dc = rc.data_config(n)
data = [tasks.load_client_data(dc, i) for i in range(n)]
on_device = [(d.x_train.to(device), d.y_train.to(device)) for d in data]
model = tasks.build_model(dc, rc.model).to(device)
loss_fn = torch.nn.functional.cross_entropy
steps, batch = int(rc.local_steps), int(rc.batch_size)
gen = torch.Generator(device="cpu").manual_seed(0)
def floor_round():
    for x, y in on_device:
        opt = torch.optim.Adam(model.parameters(), lr=float(rc.learning_rate))
        for _ in range(steps):
            idx = torch.randint(0, len(y), (min(batch, len(y)),), generator=gen).to(device)
            opt.zero_grad()
            loss_fn(model(x[idx]), y[idx]).backward()
            opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
floor_round()  # warm-up
floors = []

WRITERS = []  # the run's background writer, to wait for its writes before a floor
class CountedWriter(results.Writer):
    def __init__(self):
        super().__init__()
        WRITERS.append(self)
server_app.Writer = CountedWriter

round_times = []
original = rounds.run_rounds
def run_rounds(strategy, grid, arrays, **kw):
    after = kw["after_round"]
    marks = {"start": time.perf_counter(), "before": dict(spent)}
    def after_round(r, a, stopping=False):
        after(r, a, stopping)
        now = time.perf_counter()
        # the round's background writes (checkpoint, metrics.json) finish before the floor is
        # timed: they run beside the next round in a real run, never beside the floor
        for writer in WRITERS:
            writer.flush()
        waited = time.perf_counter() - now
        round_times.append({"round": r, "seconds": now - marks["start"], "write_wait": waited,
                            **{p: spent[p] - marks["before"][p] for p in PHASES}})
        # the floor between rounds: both timed under the same load of the machine
        for _ in range(floor_rounds):
            start = time.perf_counter(); floor_round(); floors.append(time.perf_counter() - start)
        marks["start"], marks["before"] = time.perf_counter(), dict(spent)
    kw["after_round"] = after_round
    return original(strategy, grid, arrays, **kw)
server_app.run_rounds = run_rounds

grid = inprocess.run_inprocess(cfg, n, None)
print(json.dumps({"rounds": round_times, "floor_s": min(floors), "device": str(device),
                  "threads": torch.get_num_threads()}, allow_nan=False))
"""


def run(clients: int, strategy: str, checkpoint: bool, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-round-") as tmp:
        cfg = {"strategy": strategy, "num-server-rounds": args.rounds,
               "local-steps": args.local_steps, "batch-size": 100, "min-nodes": clients,
               "results-dir": tmp, "run-name": "run", "xi-every": 0,
               "checkpoint-every": 1 if checkpoint else 0}
        if args.data_dir and Path(args.data_dir).is_dir():
            cfg.update({"dataset": "fmnist", "data-dir": str(Path(args.data_dir).resolve())})
        if strategy in ("fedamp", "heurfedamp") and cfg.get("dataset") != "fmnist":
            cfg[f"{strategy}-sigma"] = 1.0
        spec = json.dumps(cfg, allow_nan=False)
        out = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), spec,
                              str(clients), str(args.floor_repeats)],
                             capture_output=True, text=True, cwd=ROOT)
        if out.returncode != 0:
            raise RuntimeError(f"{strategy}, {clients} clients: {out.stderr[-3000:]}")
        row = json.loads(out.stdout.strip().splitlines()[-1])
    last = min(row["rounds"][1:] or row["rounds"], key=lambda r: r["seconds"])
    row["timed"] = last
    accounted = sum(last[p] for p in ("training", "evaluation", "serialisation", "server",
                                      "checkpoint"))
    last["rest"] = last["seconds"] - accounted
    row.update(clients=clients, strategy=strategy, checkpoint=checkpoint,
               dataset=cfg.get("dataset", "synthetic"), local_steps=args.local_steps,
               ratio=last["seconds"] / row["floor_s"])
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, nargs="+", default=[20, 100])
    p.add_argument("--strategies", nargs="+", default=["fedavg", "fedamp"])
    p.add_argument("--local-steps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds; the fastest after the first is reported")
    p.add_argument("--floor-repeats", type=int, default=1,
                   help="floor rounds after every round; the fastest is reported")
    p.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "fashion_mnist"))
    p.add_argument("--checkpoints", nargs="+", default=["on"], choices=["on", "off"],
                   help="a checkpoint every round (on), none (off), or both, row by row: the "
                        "difference is the checkpoint's whole cost, its writing beside the "
                        "next round included")
    p.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = p.parse_args()
    rows = []
    head = (f"{'clients':>7} {'strategy':10} {'ckpt':>4} {'round s':>8} {'floor s':>8} "
            f"{'ratio':>6} | {'train':>6} {'eval':>6} {'serial':>6} {'server':>6} {'copy':>6} "
            f"{'rest':>6}")
    print(head)
    cases = [(c, s, k) for c in args.clients for s in args.strategies for k in args.checkpoints]
    for clients, strategy, checkpoint in cases:
        row = run(clients, strategy, checkpoint == "on", args)
        rows.append(row)
        r = row["timed"]
        print(f"{clients:>7} {strategy:10} {checkpoint:>4} {r['seconds']:8.2f} "
              f"{row['floor_s']:8.2f} {row['ratio']:6.3f} | {r['training']:6.2f} "
              f"{r['evaluation']:6.2f} {r['serialisation']:6.2f} {r['server']:6.2f} "
              f"{r['checkpoint']:6.2f} {r['rest']:6.2f}", flush=True)
    print(f"device {rows[0]['device']}, {rows[0]['threads']} threads, "
          f"dataset {rows[0]['dataset']}, {args.local_steps} local steps of batch 100")
    if args.out:
        args.out.write_text(json.dumps(strict_json(rows), indent=1, allow_nan=False) + "\n")


if __name__ == "__main__":
    main()
