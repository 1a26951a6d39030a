#!/usr/bin/env bash
# Run several strategies one after another with `flwr run .` and print their
# BMTA (classification) or best mean test MSE (regression).
#
#   experiments/compare.sh NUM_CLIENTS RESULTS_DIR "RUN CONFIG" STRATEGY...
#
# e.g. the README's Fashion-MNIST comparison (practical setting, 20 clients):
#   experiments/compare.sh 20 "$PWD/results/fmnist" \
#     "dataset='fmnist' data-dir='$PWD/../shared/data/fashion_mnist' num-server-rounds=3 local-epochs=5" \
#     fedamp heurfedamp fedavg fedprox
#
# Uses a local SuperLink of its own: `flwr run` starts it on two free ports
# (FLWR_LOCAL_SUPERLINK_HTTP_API_PORT, FLWR_LOCAL_CONTROL_API_PORT) with a fresh
# FLWR_HOME, so that it never shares another run's SuperLink; it is stopped, by
# its process id, when the script ends.
set -euo pipefail
n=$1; out=$2; cfg=$3; shift 3
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
cd "$(dirname "$0")/.."
export FLWR_HOME; FLWR_HOME=$(mktemp -d)
read -r FLWR_LOCAL_SUPERLINK_HTTP_API_PORT FLWR_LOCAL_CONTROL_API_PORT < <(python - <<'PY'
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
PY
)
export FLWR_LOCAL_SUPERLINK_HTTP_API_PORT FLWR_LOCAL_CONTROL_API_PORT
stop_superlink() {  # the SuperLink this script started: the one serving its port
  python - "$FLWR_LOCAL_SUPERLINK_HTTP_API_PORT" <<'PY'
import sys
from pathlib import Path
from simulation import stop_tree
port = sys.argv[1]
for proc in Path("/proc").glob("[0-9]*"):
    try:
        args = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        continue
    if any(a.endswith(b"flower-superlink") for a in args[:2]) and b"--port" in args \
            and args[args.index(b"--port") + 1] == port.encode():
        stop_tree(int(proc.name))
PY
  rm -rf "$FLWR_HOME"
}
trap stop_superlink EXIT
mkdir -p "$out"
for s in "$@"; do
  echo "== $s"
  flwr run . --stream --federation-config "num-supernodes=$n" \
    --run-config "strategy='$s' min-nodes=$n run-name='$s' results-dir='$out' $cfg" \
    > "$out/$s.log" 2>&1 || { echo "run failed, see $out/$s.log"; exit 1; }
  grep -h "mean test" "$out/$s.log" || true
done
python - "$out" "$@" <<'PY'
import json, sys
out, names = sys.argv[1], sys.argv[2:]
runs = {s: json.load(open(f"{out}/{s}/metrics.json")) for s in names}
reg = "best_mean_mse" in next(iter(runs.values()))
key, col, scale = ("best_mean_mse", "best mean MSE", 1) if reg else ("bmta", "BMTA (%)", 100)
metric = "mean_mse" if reg else "mean_accuracy"
novel = any(f"novel_{key}" in m for m in runs.values())
head = f"| strategy | {col} |" + (f" novel clients |" if novel else "") + " per round |"
print("\n" + head + "\n" + "|---" * (head.count("|") - 1) + "|")
for s, m in runs.items():
    per = ", ".join(f"{scale * r[metric]:.4g}" for r in m["rounds"])
    extra = f" {m.get(f'novel_{key}', float('nan')):.4g} |" if novel else ""
    print(f"| {s} | {m[key]:.4g} |{extra} {per} |")
PY
