#!/usr/bin/env bash
# One prepared check on whatever accelerator JAX finds (a GPU when one is lent; the CPU otherwise), in under
# 8 minutes: the transforms' overhead against optax, the simulator's throughput against its synchronous
# engine, and the quickstart's main job, timed. Each writes RESULTS_DIR/gpu_NAME.md (default
# benchmarks/results/) with the device it ran on; a step that fails or runs past its limit says so in its
# file and the others still run.
#
#   bash benchmarks/gpu_check.sh [RESULTS_DIR] [--small]
#
# --small: the sizes the test suite runs on a CPU (tests/test_gpu_check.py), seconds instead of minutes.
# On a lent device machine: bash benchmarks/gpu_check.sh "$OUT" (what it writes under $OUT comes back).
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
results="$repo/benchmarks/results"
small=0
for arg in "$@"; do
  case "$arg" in
    --small) small=1 ;;
    -*) echo "gpu_check.sh: unknown option $arg; expected [RESULTS_DIR] [--small]" >&2; exit 2 ;;
    *) results="$arg" ;;
  esac
done
mkdir -p "$results" && results="$(cd "$results" && pwd)"  # where the caller meant, before moving to the repo
cd "$repo"
python=${PYTHON:-python}

if [ "$small" = 1 ]; then
  transform_args=(--params 200000 --rounds 3 --steps 2)
  simulator_args=(--workers 4 --strategies bsp,asp --steps 128 --rounds 2 --gradient-batches 1,K)
  quickstart_args=(--set run.gradients=200 --set run.eval_every=100)
  limits=(120 180 180)
else
  transform_args=()
  simulator_args=(--workers 4,16,64 --strategies bsp,asp,ormo --rounds 3)
  quickstart_args=()
  limits=(120 200 150)
fi

device=$("$python" -c 'import jax; d = jax.devices()[0]; print(f"{jax.default_backend()}: {d.device_kind} x{jax.device_count()}, JAX {jax.__version__}")' 2>&1 | tail -n 1)
started=$(date -u +"%Y-%m-%d %H:%M UTC")

# step NAME LIMIT COMMAND...: runs COMMAND under a time limit and writes its output as RESULTS_DIR/gpu_NAME.md.
step() {
  local name=$1 limit=$2
  shift 2
  local file="$results/gpu_$name.md" began took code
  began=$(date +%s.%N)
  { timeout "$limit" "$@"; } >"$file.out" 2>"$file.err"
  code=$?
  took=$(awk -v a="$began" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  {
    echo "# gpu_check: $name"
    echo
    echo "- Device: $device"
    echo "- Date: $started"
    echo "- Command: \`$*\` (limit ${limit} s)"
    echo "- Wall time: ${took} s; exit code $code$([ "$code" = 124 ] && echo ' (past its limit)')"
    echo
    cat "$file.out"
    if [ "$code" != 0 ]; then
      echo
      echo "Last lines of its error output:"
      echo
      echo '```'
      tail -n 20 "$file.err"
      echo '```'
    fi
  } >"$file"
  rm -f "$file.out" "$file.err"
  echo "gpu_check: $name: exit code $code in ${took} s -> $file"
  return 0
}

step transform_overhead "${limits[0]}" "$python" -m benchmarks.speed.transform_overhead "${transform_args[@]}"
step simulator_throughput "${limits[1]}" "$python" -m benchmarks.speed.simulator_throughput "${simulator_args[@]}"
quickstart_out=$(mktemp -d)
step quickstart "${limits[2]}" "$python" -m jaxsync.cli train configs/quickstart.yaml --out "$quickstart_out/run" \
  --progress quiet "${quickstart_args[@]}"
if [ -f "$quickstart_out/run/summary.json" ]; then
  { echo; echo "The run's summary.json:"; echo; echo '```json'; cat "$quickstart_out/run/summary.json"; echo; echo '```'; } \
    >>"$results/gpu_quickstart.md"
fi
rm -rf "$quickstart_out"
echo "gpu_check: done on $device"
