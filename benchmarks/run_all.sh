#!/usr/bin/env bash
# Runs every benchmark at its default size and writes benchmarks/results/*.md and PNGs.
#
#   benchmarks/run_all.sh                  # everything, default size (many hours on 2 CPU cores; each paper
#                                          # benchmark resumes from its results store, so run it in sittings)
#   benchmarks/run_all.sh --size full      # the documented bigger size (hours; for bigger machines)
#   BENCHMARKS="inhad_layouts ea_wild_comparison" benchmarks/run_all.sh   # a subset
#
# The paper benchmarks run first and the speed benchmarks (performance) last and alone: timings
# are only comparable on an otherwise idle machine. Each script's log goes to runs/bench/<name>.log.
set -euo pipefail
cd "$(dirname "$0")/.."
# low_communication.py and sim_vs_real.py (network namespaces, root) take their own arguments: run them alone.
BENCHMARKS=${BENCHMARKS:-"ormo_table adaptive_k_comparison adaptive_k_regimes ea_wild_comparison inhad_layouts server_bound advisor_check sharded_server node_aggregation fault_campaign performance"}
mkdir -p runs/bench
for name in $BENCHMARKS; do
  echo "== $name $*" >&2
  start=$(date +%s)
  python "benchmarks/$name.py" "$@" 2>&1 | tee "runs/bench/$name.log" | { grep -E "wrote|performance" >&2 || true; }
  echo "== $name done in $(( $(date +%s) - start )) s" >&2
done
python benchmarks/results_page.py  # the Results page's verdict table, from the verdict files
