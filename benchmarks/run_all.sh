#!/usr/bin/env bash
# Runs every benchmark at its default size and writes benchmarks/results/*.md and PNGs.
#
#   benchmarks/run_all.sh                  # everything, default size (about 4 hours on 2 CPU cores)
#   benchmarks/run_all.sh --size full      # the documented bigger size (hours; for bigger machines)
#   BENCHMARKS="inhad_layouts ea_wild_comparison" benchmarks/run_all.sh   # a subset
#
# The paper benchmarks run first and the speed benchmarks (performance) last and alone: timings
# are only comparable on an otherwise idle machine. Each script's log goes to runs/bench/<name>.log.
set -euo pipefail
cd "$(dirname "$0")/.."
BENCHMARKS=${BENCHMARKS:-"ormo_table adaptive_k_comparison adaptive_k_regimes ea_wild_comparison inhad_layouts server_bound advisor_check sharded_server node_aggregation fault_campaign performance"}
mkdir -p runs/bench
for name in $BENCHMARKS; do
  echo "== $name $*" >&2
  start=$(date +%s)
  python "benchmarks/$name.py" "$@" 2>&1 | tee "runs/bench/$name.log" | { grep -E "wrote|performance" >&2 || true; }
  echo "== $name done in $(( $(date +%s) - start )) s" >&2
done
