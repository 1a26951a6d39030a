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
# Uses the local SuperLink that `flwr run` starts (stop it by its process id
# afterwards); set FLWR_HOME to keep it apart from other runs.
set -euo pipefail
n=$1; out=$2; cfg=$3; shift 3
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
cd "$(dirname "$0")/.."
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
