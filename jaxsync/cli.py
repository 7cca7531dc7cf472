"""The ``jaxsync`` command: train, compare and resume simulated runs; list the strategies.

  jaxsync train configs/quickstart.yaml [--set run.gradients=800] [--out runs/q]
  jaxsync compare configs/ormo_table.yaml --strategies asp,ormo --seeds 3
  jaxsync advise configs/quickstart.yaml [--fraction 0.25] [--seeds 2]   (which strategy to use)
  jaxsync calibrate configs/quickstart.yaml --out quickstart_here.yaml   (measure this machine)
  jaxsync resume runs/q
  jaxsync launch -n 3 configs/quickstart.yaml --set cluster.num_workers=2   (real processes)
  jaxsync strategies
  jaxsync config [configs/quickstart.yaml]   (every key with its default and meaning; a config resolved)

Exit codes: 0 on success, 2 for a bad command line, config, data path or run
directory (one line on stderr, no traceback; ``--traceback`` anywhere on the
line shows it, with the same exit code), 3 when a multi-process run loses a
process it cannot go on without (one line naming it), 1 for anything else,
75 when a run stopped on SIGTERM (a preemption notice) after writing a
checkpoint at its next chunk boundary (``jaxsync resume`` continues it
exactly), 130 when interrupted (Ctrl-C: the first stops the run at its next
chunk boundary with a checkpoint, as SIGTERM does; a second stops it at once;
the line says how to continue the run).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import signal
import sys
import threading
import traceback

# Only what the parser needs: a command imports the runtime when it runs (`jaxsync --help` does not).
from jaxsync._src.train import progress, run_directory


def _user_errors() -> tuple[type[Exception], ...]:
  """The errors of a bad config, data path, run directory or checkpoint: one line, exit code 2."""
  from jaxsync._src.app.config import ConfigError
  from jaxsync._src.train.checkpoints import CheckpointError
  from jaxsync._src.train.run_directory import RunDirectoryError
  from jaxsync._src.train.training import EmptyRunError

  return (ConfigError, RunDirectoryError, CheckpointError, EmptyRunError)


class _Parser(argparse.ArgumentParser):
  """argparse's parser, whose errors also suggest the closest command, choice or option ("did you mean")."""

  def error(self, message):
    from jaxsync._src.core.suggestions import did_you_mean

    choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
    if choice:
      message += did_you_mean(choice.group(1), re.findall(r"'([^']*)'", choice.group(2)))
    unknown = re.match(r"unrecognized arguments: (.*)$", message)
    if unknown:
      message += "".join(
        did_you_mean(word.split("=")[0], self._every_option())
        for word in unknown.group(1).split()
        if word[:2] == "--"
      )
    super().error(message)

  def _every_option(self) -> list[str]:
    """The long options of this parser and of its commands (argparse reports a command's unknown ones here)."""
    parsers = [self]
    for action in self._actions:
      if isinstance(action, argparse._SubParsersAction):
        parsers += list(action.choices.values())
    return sorted({o for p in parsers for o in p._option_string_actions if o.startswith("--")})


def _parser() -> argparse.ArgumentParser:
  from jaxsync import __version__

  # --traceback is accepted before and after the command (SUPPRESS: a subcommand's default does not
  # overwrite a value given before it).
  common = _Parser(add_help=False)
  common.add_argument(
    "--traceback", action="store_true", default=argparse.SUPPRESS, help="show Python tracebacks of errors"
  )
  parser = _Parser(
    prog="jaxsync",
    description="Synchronization strategies for data-parallel training, on a simulated cluster or real processes.",
    epilog="Run `jaxsync COMMAND --help` for a command's options.",
    parents=[common],
  )
  parser.add_argument("--version", action="version", version=f"jaxsync {__version__}")
  sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
  add_parser = sub.add_parser

  def with_common(name, **kwargs):
    return add_parser(name, parents=[common], **kwargs)

  sub.add_parser = with_common

  def run_options(p, *, config: bool):
    if config:
      p.add_argument("config", type=pathlib.Path, help="a YAML config, e.g. configs/quickstart.yaml")
      p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set cluster.num_workers=16 (repeatable)",
      )
      p.add_argument("--out", type=pathlib.Path, help="the run directory (default: runs/NAME, never reused)")
      p.add_argument(
        "--overwrite", action="store_true", help="replace --out if it is an existing run directory"
      )
    p.add_argument(
      "--progress",
      choices=progress.MODES,
      default="bar",
      help="a live progress bar (default), JSON lines on stdout, or nothing",
    )

  def restarts_option(p):
    p.add_argument(
      "--max-restarts",
      type=int,
      default=0,
      metavar="N",
      help="restart what fails, N times at most: a parameter-server worker alone, else every process from "
      "the last checkpoint (RUN_DIR/restarts.jsonl lists them; default 0)",
    )
    p.add_argument(
      "--rejoin-delay",
      type=float,
      default=0.0,
      metavar="SECONDS",
      help="wait this long before restarting a failed parameter-server worker, as a replacement machine "
      "arrives later (an elastic DiLoCo run goes on without it meanwhile; default 0); with --min-workers, "
      "when a synchronous run's replacement arrives",
    )
    p.add_argument(
      "--min-workers",
      type=int,
      default=None,
      metavar="M",
      help="a synchronous run that loses processes goes on with the survivors as a smaller run (from the "
      "last completed round) while at least M are left, and grows back when the replacements arrive "
      "(needs --max-restarts and --rejoin-delay; cluster.shrink_keeps says what is rescaled)",
    )

  def process_options(p):
    g = p.add_argument_group(
      "multi-process runs",
      "jaxsync launch sets these for local processes; on a cluster JAX detects SLURM, TPU pods and "
      "Kubernetes itself, or give all three",
    )
    g.add_argument("--coordinator", metavar="HOST:PORT", help="the coordination service (process 0's host)")
    g.add_argument("--num-processes", type=int, metavar="N", help="processes in the run")
    g.add_argument("--process-id", type=int, metavar="I", help="this process's id, 0..N-1")
    g.add_argument(
      "--single-process", action="store_true", help="ignore any detected cluster: run the simulator"
    )

  train = sub.add_parser(
    "train", help="train one config into a run directory", description="Train one config."
  )
  run_options(train, config=True)
  process_options(train)
  launch = sub.add_parser(
    "launch",
    help="train one config on N local processes (a real parameter server or all-reduce)",
    description="Start N local processes of one run (coordinator on --bind, a free port); stream their logs.",
  )
  launch.add_argument(
    "-n", "--num-processes", type=int, required=True, metavar="N", help="processes to start"
  )
  launch.add_argument(
    "--bind", default="127.0.0.1", help="the interface every socket binds to (default: loopback only)"
  )
  restarts_option(launch)
  run_options(launch, config=True)
  compare = sub.add_parser(
    "compare",
    help="run several strategies and seeds of a config; one table and one set of plots",
    description="Same model, data and time model; several strategies and seeds; results.md and plots.",
  )
  run_options(compare, config=True)
  compare.add_argument(
    "--strategies", help="comma-separated names (default: the config's compare.strategies)"
  )
  compare.add_argument("--seeds", type=int, help="seeds per strategy (default: compare.seeds)")
  advise = sub.add_parser(
    "advise",
    help="run the beginning of each candidate strategy's run and recommend one, with how sure",
    description="Short runs of the candidates on the config's model, data and cluster: a ranked table of "
    "estimated time to the target accuracy (or accuracy at a time budget), its range over seeds, and a pick.",
  )
  run_options(advise, config=True)
  advise.add_argument(
    "--strategies", help="comma-separated candidates (default: the config's compare.strategies)"
  )
  advise.add_argument("--seeds", type=int, default=2, help="seeds per candidate (default: 2)")
  advise.add_argument(
    "--plan",
    type=pathlib.Path,
    metavar="PLAN.yaml",
    help="time each candidate's steps on this plan's cluster (jaxsync plan) instead of the config's: the "
    "steps come from the short runs, the seconds per step from the planner",
  )
  advise.add_argument(
    "--fraction",
    type=float,
    default=0.25,
    help="the share of run.gradients each short run computes (default: 0.25)",
  )
  goal = advise.add_mutually_exclusive_group()
  goal.add_argument("--target", type=float, help="the accuracy to reach (default: run.target_accuracy)")
  goal.add_argument(
    "--time-budget", type=float, metavar="SECONDS", help="rank by accuracy after this many simulated seconds"
  )
  calibrate = sub.add_parser(
    "calibrate",
    help="measure this machine for the simulator: compute time and jitter, link, server cost per arrival",
    description="Measures what the simulator's time model needs on this machine: the config model's compute "
    "time per step and its spread, a link's latency and bandwidth (ZeroMQ round trips, over loopback or to "
    "`jaxsync calibrate --serve-echo PORT` on another host), the parameter server's time per arrival, and with "
    "--collective-processes what an all-reduce across processes takes beyond the ring formula. "
    "Prints the measured cluster: section; --out writes the whole config with it, which train, compare, "
    "advise and launch take as it is.",
  )
  calibrate.add_argument(
    "config", type=pathlib.Path, nargs="?", help="a YAML config, e.g. configs/quickstart.yaml"
  )
  calibrate.add_argument(
    "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a value"
  )
  calibrate.add_argument("--out", type=pathlib.Path, help="write the config with the measured cluster here")
  calibrate.add_argument(
    "--processes",
    type=int,
    default=1,
    help="compute probes run at once, sharing the cores as a run's workers on this machine would (default: 1)",
  )
  calibrate.add_argument("--steps", type=int, default=100, help="steps timed per probe (default: 100)")
  calibrate.add_argument(
    "--link-to", metavar="tcp://HOST:PORT", help="measure the link to this echo (default: loopback)"
  )
  calibrate.add_argument(
    "--link-senders",
    type=int,
    default=1,
    metavar="K",
    help="also measure the --link-to echo's card shared by K senders at once, this host and K - 1 "
    "--stream-peer hosts (what a parameter server's card moves when its workers push at once): "
    "cluster.server_link (default: 1, not measured)",
  )
  calibrate.add_argument(
    "--stream-peer",
    metavar="tcp://HOST:PORT",
    help="only be another sender of a --link-senders measurement to this echo, until the echo stops",
  )
  calibrate.add_argument(
    "--check",
    metavar="STRATEGY",
    help="then run STRATEGY on real processes of this machine (jaxsync launch) and its simulation, and keep "
    "the errors in cluster.calibration.check (the advisor prints them)",
  )
  calibrate.add_argument(
    "--check-gradients", type=int, default=400, help="gradients of the --check run (default: 400)"
  )
  calibrate.add_argument(
    "--serve-echo",
    type=int,
    metavar="PORT",
    help="only answer another host's link measurement, until stopped",
  )
  calibrate.add_argument("--bind", default="0.0.0.0", help="the interface --serve-echo listens on")
  calibrate.add_argument(
    "--collective-processes",
    type=int,
    metavar="N",
    help="also time all-reduces across N processes (jax.distributed) and keep what each takes beyond the ring "
    "formula as cluster.collective_overhead (default: not measured)",
  )
  calibrate.add_argument(
    "--collective-coordinator",
    metavar="HOST:PORT",
    help="run the collective probe across hosts: this process is its process 0, its coordinator at HOST:PORT "
    "(default: all N processes on this machine)",
  )
  calibrate.add_argument(
    "--collective-peer",
    metavar="HOST:PORT",
    help="only be process --process-id of another host's collective probe (with --collective-processes N)",
  )
  calibrate.add_argument("--process-id", type=int, help="this process's index in --collective-peer's probe")
  resume = sub.add_parser(
    "resume",
    help="continue a run (or a compare) from its latest checkpoint",
    description="Continue a run directory or a compare directory from its latest checkpoints.",
  )
  resume.add_argument("run_dir", type=pathlib.Path, help="a directory written by train or compare")
  run_options(resume, config=False)
  restarts_option(resume)
  process_options(resume)
  plan = sub.add_parser(
    "plan",
    help="plan a run at any scale without training: step time, utilization, bytes, goodput, bandwidth needed",
    description="Plans each strategy of a plan config (configs/plan/*.yaml) on the simulator's own clock: "
    "step time, compute utilization, goodput under failures, wall-clock time to the budget, bytes over the "
    "links and the bandwidth each needs for 50/80/90/95/99% compute utilization; prints the table and "
    "writes plan.md, plan.json and utilization.png. Nothing is trained; it predicts no accuracy or loss.",
  )
  plan.add_argument(
    "config", type=pathlib.Path, help="a plan config, e.g. configs/plan/four_datacenters.yaml"
  )
  plan.add_argument(
    "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a value"
  )
  plan.add_argument("--out", type=pathlib.Path, help="where to write the files (default: runs/plan-NAME)")
  sub.add_parser(
    "strategies",
    help="list the strategies with their options and defaults",
    description="List the registry's strategies with their options and defaults.",
  )
  config = sub.add_parser(
    "config",
    help="every config key with its default, type and meaning; or a config file as a run would read it",
    description="Without CONFIG: every key of a config, with its default, type and meaning. With CONFIG "
    "(and --set overrides): the whole config as a run would use it, defaults filled in, validated.",
  )
  config.add_argument("config", type=pathlib.Path, nargs="?", help="a YAML config to resolve")
  config.add_argument(
    "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a value"
  )
  config.add_argument("--markdown", action="store_true", help="the key reference as Markdown tables")
  return parser


def _config(args: argparse.Namespace) -> str:
  import yaml

  from jaxsync._src.app import config as config_lib

  if args.config is None:
    if args.overrides:
      raise config_lib.ConfigError(
        "--set needs a CONFIG to apply to; e.g. jaxsync config configs/quickstart.yaml --set ..."
      )
    from jaxsync._src.app import config_reference

    return config_reference.reference_markdown() if args.markdown else config_reference.reference_text()
  if args.markdown:
    raise config_lib.ConfigError("--markdown is for the key reference; expected no CONFIG with it.")
  cfg = config_lib.load(args.config, args.overrides)
  return yaml.safe_dump(config_lib.to_dict(cfg), sort_keys=False)


def _launch(args: argparse.Namespace, run_args: list[str], run_dir: pathlib.Path, roles) -> int:
  from jaxsync._src.distributed import launch

  policy = launch.RestartPolicy(
    run_dir=run_dir,
    **roles._asdict(),
    **_supervision(args),  # alone, kept_down, settle, host_service
  )
  return launch.launch(args.num_processes, run_args, bind=args.bind, restarts=policy)


def _supervision(args: argparse.Namespace) -> dict:
  """The supervisor's options ``check_launch`` checks against the run."""
  return {
    "min_workers": args.min_workers,
    "max_restarts": args.max_restarts,
    "rejoin_delay": args.rejoin_delay,
  }


def _group(args: argparse.Namespace):
  """This process's multi-process group (None: the simulator), decided and logged once."""
  from jaxsync._src.distributed import cluster

  if getattr(args, "single_process", False):
    return None
  try:
    return cluster.initialize(
      coordinator=args.coordinator, num_processes=args.num_processes, process_id=args.process_id
    )
  except cluster.ClusterError as err:
    from jaxsync._src.app.config import ConfigError

    raise ConfigError(str(err)) from None


def _in_a_launched_or_cluster_run(args: argparse.Namespace) -> bool:
  from jaxsync._src.distributed import cluster

  return bool(getattr(args, "coordinator", None) or os.environ.get(cluster.ENV_COORDINATOR))


def _plan(args: argparse.Namespace) -> int:
  from jaxsync._src.app import plan_config

  cfg = plan_config.load_plan(args.config, args.overrides)
  result = plan_config.run_plan(cfg)
  out = args.out or pathlib.Path("runs", f"plan-{cfg.name}")
  t = cfg.topology
  title = (
    f"{cfg.name}: {cfg.model.parameters / 1e9:.3g}B parameters, {t.workers} workers of {t.chips_per_worker} "
    f"{cfg.hardware.accelerator} (time only, no accuracy)"
  )
  files = plan_config.write_plan(result, out, title)
  print(plan_config.plan_table(result))
  print("\nwrote " + ", ".join(str(f) for f in files))
  return 0


def _dispatch(args: argparse.Namespace) -> int:
  from jaxsync._src.app import commands
  from jaxsync._src.app import config as config_lib

  if args.command == "strategies":
    print(commands.strategies_table())
    return 0
  if args.command == "config":
    print(_config(args), end="")
    return 0
  if args.command == "calibrate":
    from jaxsync._src.app import calibrate

    return calibrate.command(args)
  if args.command == "plan":
    return _plan(args)
  commands.check_restarts(getattr(args, "max_restarts", 0), getattr(args, "rejoin_delay", 0.0))  # first
  if args.command == "launch":
    cfg = config_lib.load(args.config, args.overrides)  # a bad config fails here, not in N processes
    roles = commands.check_launch(cfg, args.num_processes, **_supervision(args))
    out = args.out or commands.default_out(cfg.name)
    run_directory.check_available(out, overwrite=args.overwrite)
    args.run_dir_in_use = out
    run_args = ["train", str(args.config), "--out", str(out), "--progress", args.progress]
    run_args += [f"--set={o}" for o in args.overrides] + (["--overwrite"] if args.overwrite else [])
    return _launch(args, run_args, out, roles)
  if args.command == "resume":
    args.run_dir_in_use = args.run_dir
    processes = commands.launched_processes(args.run_dir)
    from jaxsync._src.distributed import cluster

    on_cluster = (
      args.coordinator is not None or os.environ.get(cluster.ENV_COORDINATOR) or cluster.detected_cluster()
    )
    if processes and not on_cluster:
      # A multi-process run directory, resumed from a shell: start its processes again, locally.
      args.num_processes, args.bind = processes, "127.0.0.1"
      roles = commands.check_launch(commands.read_config(args.run_dir), processes, **_supervision(args))
      return _launch(args, ["resume", str(args.run_dir), "--progress", args.progress], args.run_dir, roles)
  cfg = out = None
  if args.command in ("train", "compare", "advise"):
    cfg = config_lib.load(args.config, args.overrides)
    suffix = {"train": "", "compare": "-compare", "advise": "-advice"}[args.command]
    out = args.out or commands.default_out(f"{cfg.name}{suffix}")
    if not _in_a_launched_or_cluster_run(args):  # there, process 0 checks (or the launcher did)
      run_directory.check_available(out, overwrite=args.overwrite)  # in a second, before the set-up
    args.run_dir_in_use = out
  if args.command == "advise":
    return _advise(args, cfg, out)
  reporter = progress.make(args.progress)
  group = _group(args) if args.command in ("train", "resume") else None  # compare: the simulator only
  if args.command == "resume":
    stop = _PreemptionNotice()
    result = commands.resume(args.run_dir, reporter=reporter, group=group, stop_requested=stop)
  else:
    if args.command == "train":
      stop = _PreemptionNotice()
      result = commands.train(
        cfg, out, overwrite=args.overwrite, reporter=reporter, group=group, stop_requested=stop
      )
    else:
      if args.seeds is not None and args.seeds < 1:
        raise config_lib.ConfigError(f"--seeds={args.seeds} is invalid; expected a positive integer.")
      names = [n.strip() for n in args.strategies.split(",") if n.strip()] if args.strategies else None
      result = commands.compare(
        cfg, out, strategy_names=names, seeds=args.seeds, overwrite=args.overwrite, reporter=reporter,
        stop_requested=_PreemptionNotice(),
      )  # fmt: skip
  if result is None:
    return 0
  runs = [r for rs in result["results"].values() for r in rs] if isinstance(result, dict) else [result]
  for run in runs:  # whatever the progress mode: one line on stderr per diverged run
    if run.summary.get("diverged"):
      print(
        f"jaxsync: warning: {run.summary.get('label', 'the run')} diverged: {run.summary['diverged_because']} "
        f"(run directory {run.run_dir}).",
        file=sys.stderr,
      )
  if args.progress == "jsonl":
    return 0
  if isinstance(result, dict):
    print(result["table"], end="")
    # stdout stays the table (for a pipe); where it and the runs went goes to stderr.
    print(
      f"jaxsync compare: the table (results.md), results.json, plots/ and every run are in {result['run_dir']}",
      file=sys.stderr,
    )
  elif args.progress != "quiet":
    from jaxsync._src.train.summary import final_line

    print(final_line(result.summary, result.run_dir))
  return 0


def _advise(args: argparse.Namespace, cfg, out: pathlib.Path) -> int:
  from jaxsync._src.app import commands

  names = [n.strip() for n in args.strategies.split(",") if n.strip()] if args.strategies else None

  def say(line: str) -> None:
    if args.progress == "bar":
      print(f"jaxsync advise: {line}", file=sys.stderr, flush=True)

  plan = None
  if args.plan is not None:
    from jaxsync._src.app import plan_config

    plan = plan_config.run_plan(plan_config.load_plan(args.plan))
  advice = commands.advise(
    cfg,
    out,
    strategy_names=names,
    seeds=args.seeds,
    fraction=args.fraction,
    target=args.target,
    time_budget=args.time_budget,
    overwrite=args.overwrite,
    progress=say,
    plan=plan,
  )
  if args.progress == "jsonl":
    print(json.dumps(json.loads((out / "advice.json").read_text())))
  elif args.progress != "quiet":
    print(
      f"{advice.table()}\n\nRecommended: {advice.recommended}. {advice.reason}\n\n"
      f"{commands.plan_note(plan) if plan is not None else commands.clock_note(cfg.cluster)}\n(written to {out})"
    )
  return 0


# The exit code of a run stopped by a preemption notice, its checkpoint written: "try again later"
# (EX_TEMPFAIL of sysexits.h), so that a scheduler or a script can tell it from a failure and resume.
EXIT_PREEMPTED = 75


class _PreemptionNotice:
  """SIGTERM (or Ctrl-C) asks a run to stop at its next safe point, with a checkpoint.

  SLURM, Kubernetes and TPU VMs send SIGTERM, with a grace period, before they
  take a machine. The first SIGTERM or SIGINT is noted and the run stops after
  the chunk it is in (``run.chunk`` events; before the first chunk, after it:
  compiling first), writing a checkpoint there; a second one ends the process
  at once (SIGTERM as it does by default, SIGINT with ``KeyboardInterrupt``;
  where that exception lands in a callback Python cannot propagate it from, such
  as XLA's garbage-collector callback, Python drops it and the first's stop at
  the chunk's end, with its checkpoint, stands).
  In a multi-process run every process asks its own notice: the processes of
  a synchronous run stop together at the round where the first notice is seen,
  a parameter server (process 0) at its chunk's end, telling its workers to
  stop; a worker alone waits for the server's stop for a grace period.
  """

  by: int | None = None  # the signal that asked (class-wide: one notice per process)

  def __init__(self):
    _PreemptionNotice.by = None
    if threading.current_thread() is threading.main_thread():
      signal.signal(signal.SIGTERM, self._note)
      signal.signal(signal.SIGINT, self._note)

  def _note(self, signum, frame):
    if _PreemptionNotice.by is not None:
      if signum == signal.SIGINT:
        raise KeyboardInterrupt
      raise SystemExit(128 + signum)
    _PreemptionNotice.by = signum
    if signum == signal.SIGINT:
      print(
        "\njaxsync: stopping at the end of this chunk, with a checkpoint (Ctrl-C again to stop now).",
        file=sys.stderr,
        flush=True,
      )

  def __call__(self) -> bool:
    return _PreemptionNotice.by is not None


def _stop_on_ctrl_c() -> None:
  """Makes SIGINT raise ``KeyboardInterrupt`` even where the process started with it ignored.

  A command started in the background by a non-interactive shell (a script's ``cmd &``, a CI job, a
  test harness) inherits SIGINT ignored, and Python then leaves it ignored: Ctrl-C, or a supervisor's
  SIGINT, would never stop the run. A run must stop on SIGINT whatever started it.
  """
  if threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: list[str] | None = None) -> int:
  """Runs the command line ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
  args = _parser().parse_args(argv)  # --help, --version and a bad command line exit here
  _stop_on_ctrl_c()
  from jaxsync._src.distributed.cluster import RunFaultError
  from jaxsync._src.train.training import PreemptedError

  user_errors = _user_errors()
  show = getattr(args, "traceback", False) or os.environ.get("JAXSYNC_TRACEBACK")
  try:
    code = _dispatch(args)
    sys.stdout.flush()  # here, where a closed pipe is caught, not at exit
  except BrokenPipeError:  # `jaxsync strategies | head`: the reader has what it wanted
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
    return 0
  except PreemptedError as err:
    how = "interrupted (Ctrl-C)" if _PreemptionNotice.by == signal.SIGINT else "preempted (SIGTERM)"
    if err.done is None:  # a worker of a parameter-server run: it holds nothing the server has not
      print(f"jaxsync: {err}.", file=sys.stderr)
      sys.stderr.flush()
      os._exit(EXIT_PREEMPTED)  # as a killed worker leaves: it may be started again to rejoin
    print(
      f"jaxsync: {how} after {err.done} events, all of them in the run's last checkpoint; "
      f"continue the run with `jaxsync resume {args.run_dir_in_use}`.",
      file=sys.stderr,
    )
    return 130 if _PreemptionNotice.by == signal.SIGINT else EXIT_PREEMPTED
  except KeyboardInterrupt:
    run_dir = getattr(args, "run_dir_in_use", None)
    if run_dir is not None and pathlib.Path(run_dir, "config.yaml").is_file():
      print(f"jaxsync: interrupted; continue the run with `jaxsync resume {run_dir}`.", file=sys.stderr)
    else:
      print("jaxsync: interrupted before the run started; nothing was written.", file=sys.stderr)
    return 130
  except RunFaultError as err:  # a lost process, server or worker: one line naming it, exit 3
    if show:
      traceback.print_exc()
    print(f"jaxsync: error: {err}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the exit handlers: jax.distributed's shutdown aborts the process when
    # the coordinator is already gone, burying this line under a C++ stack trace.
    os._exit(3)
  except user_errors as err:  # configs, data paths, run directories, checkpoints: one line, exit 2
    if show:
      traceback.print_exc()
    print(f"jaxsync: error: {err}", file=sys.stderr)
    return 2
  return code  # anything else is a bug: Python prints its traceback and the exit code is 1


if __name__ == "__main__":
  sys.exit(main())
