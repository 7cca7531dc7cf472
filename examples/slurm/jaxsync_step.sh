# Sourced by the batch scripts in this folder: `run_jaxsync RUN_DIR CONFIG [--set KEY=VALUE ...]`.
#
# Runs one `srun` step of `jaxsync train` (or `jaxsync resume RUN_DIR` when RUN_DIR already holds the run:
# a requeued job), one task per process. jax.distributed reads the coordinator (the step's first node), the
# process count (SLURM_NTASKS) and each process's rank (SLURM_PROCID) from SLURM's environment: no
# addresses to set. RUN_DIR must be on a filesystem every node sees.
#
# Preemption, the way SLURM gives notice:
#   - `--signal=B:TERM@SECONDS` (or `scancel --signal=TERM --batch JOB`) signals this batch shell: it passes
#     SIGTERM on to the step's tasks;
#   - `scancel --signal=TERM JOB` signals the tasks directly.
# Either way every process stops at its next chunk with a checkpoint and exits 75; the job then requeues
# itself (submit it with --requeue), and its next start resumes from RUN_DIR, so that it ends with the final
# parameters of an uninterrupted run.
#
# A process that dies (its node fails, it is killed): the job requeues itself too, at most
# JAXSYNC_MAX_REQUEUES times (default 3), and resumes from the last checkpoint. With
# JAXSYNC_HOST_SERVICE=1 (the synchronous examples set it) this batch shell, on the job's first node, runs
# the jax.distributed coordination service instead of process 0: process 0's death then ends no other
# process, and process 1 writes the checkpoint of every completed round in its place, so that no
# completed round is lost whichever process dies.

run_jaxsync() {
  local run=$1 config=$2
  shift 2
  local command=(train "$config" "$@" --out "$run")
  if [ -f "$run/config.yaml" ]; then
    command=(resume "$run")
  fi
  echo "jaxsync on SLURM: job ${SLURM_JOB_ID:?not a SLURM job: submit this script with sbatch} (restart" \
    "${SLURM_RESTART_COUNT:-0}), ${SLURM_NTASKS:?no SLURM_NTASKS: ask sbatch for tasks} tasks: jaxsync ${command[*]}"
  local service=
  if [ -n "${JAXSYNC_HOST_SERVICE:-}" ]; then
    # Where JAX's SLURM detection looks for it: this node (the step's first), port 61440 + job id mod 4096.
    local ready
    ready=$(mktemp)
    python3 -m jaxsync._src.distributed.coordination_service "0.0.0.0:$((SLURM_JOB_ID % 4096 + 61440))" \
      "$SLURM_NTASKS" "${JAXSYNC_HEARTBEAT_TIMEOUT:-10}" >"$ready" 2>/dev/null &
    service=$!
    for _ in $(seq 600); do grep -q ready "$ready" && break; sleep 0.1; done
    rm -f "$ready"
    export JAXSYNC_COORDINATION_SERVICE=launcher
  fi
  srun --kill-on-bad-exit=0 jaxsync "${command[@]}" --progress quiet &
  local step=$!
  # The notice to this shell goes on to every task of the step (srun itself may not pass SIGTERM on).
  trap 'echo "jaxsync on SLURM: SIGTERM: the step stops at its next checkpoint"; scancel --signal=TERM "$SLURM_JOB_ID"' TERM
  local code=0
  wait "$step" || code=$?
  while kill -0 "$step" 2>/dev/null; do # a trapped signal ends `wait` early: wait for the step itself
    code=0
    wait "$step" || code=$?
  done
  trap - TERM
  if [ -n "$service" ]; then
    kill "$service" 2>/dev/null
    wait "$service" 2>/dev/null
  fi
  if [ "$code" = 75 ]; then
    echo "jaxsync on SLURM: stopped with a checkpoint (exit 75); requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
  elif [ "$code" != 0 ] && [ "$code" != 2 ] && [ "${SLURM_RESTART_COUNT:-0}" -lt "${JAXSYNC_MAX_REQUEUES:-3}" ]; then
    echo "jaxsync on SLURM: a process failed (exit $code); requeueing job $SLURM_JOB_ID to resume from its" \
      "checkpoint (requeue $((${SLURM_RESTART_COUNT:-0} + 1)) of ${JAXSYNC_MAX_REQUEUES:-3})"
    scontrol requeue "$SLURM_JOB_ID"
  fi
  return "$code"
}
