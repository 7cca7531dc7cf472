#!/usr/bin/env bash
# Runs every benchmark at its default size and writes benchmarks/results/*.md and PNGs.
#
#   benchmarks/run_all.sh                  # everything, default size (many hours on 2 CPU cores; each paper
#                                          # benchmark resumes from its results store, so run it in sittings)
#   benchmarks/run_all.sh --size full      # the documented bigger size (hours; for bigger machines)
#   BENCHMARKS="claims.inhad_layouts claims.ea_wild_comparison" benchmarks/run_all.sh   # a subset
#
# The paper benchmarks run first and the speed benchmarks (performance) last and alone: timings
# are only comparable on an otherwise idle machine. Each script's log goes to runs/bench/<name>.log.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each name is a module under benchmarks/ (GROUP.NAME). claims.low_communication (hours; it resumes from its
# store) and calibration.sim_vs_real
# (network namespaces, root) take their own arguments: run them alone.
BENCHMARKS=${BENCHMARKS:-"claims.ormo_table claims.adaptive_k_comparison claims.adaptive_k_regimes claims.ea_wild_comparison claims.inhad_layouts speed.server_bound claims.advisor_check speed.sharded_server speed.node_aggregation faults.fault_campaign faults.churn speed.performance"}
mkdir -p runs/bench
for name in $BENCHMARKS; do
  echo "== $name $*" >&2
  start=$(date +%s)
  python -m "benchmarks.$name" "$@" 2>&1 | tee "runs/bench/$name.log" | { grep -E "wrote|performance" >&2 || true; }
  echo "== $name done in $(( $(date +%s) - start )) s" >&2
done
python -m benchmarks.pages.results_page  # the Results page's verdict table, from the verdict files
