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

run_jaxsync() {
  local run=$1 config=$2
  shift 2
  local command=(train "$config" "$@" --out "$run")
  if [ -f "$run/config.yaml" ]; then
    command=(resume "$run")
  fi
  echo "jaxsync on SLURM: job ${SLURM_JOB_ID:?not a SLURM job: submit this script with sbatch} (restart" \
    "${SLURM_RESTART_COUNT:-0}), ${SLURM_NTASKS:?no SLURM_NTASKS: ask sbatch for tasks} tasks: jaxsync ${command[*]}"
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
  if [ "$code" = 75 ]; then
    echo "jaxsync on SLURM: stopped with a checkpoint (exit 75); requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
  fi
  return "$code"
}
