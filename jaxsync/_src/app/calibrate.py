"""``jaxsync calibrate``: a config's cluster measured on this machine, written as a ``cluster:`` section.

The compute probe runs in ``processes`` processes at once when asked, as a
run's workers share a machine's cores; each process builds the config's model
and data, warms up, and times the same seconds (a common start time). A
process that stands for one of the run's emulated slow workers sleeps between
its steps as that worker does, so the probes load the cores as the run will.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Any

import numpy as np
import yaml

from jaxsync._src.app import config as config_lib
from jaxsync._src.app import experiment
from jaxsync._src.calibration import agreement, calibration
from jaxsync._src.core import validation
from jaxsync._src.strategies import registry as strategies


# Seconds the extra compute probes get to start, build and compile before the common start (processes
# that start together on few cores take longer each).
def _start_slack(processes: int) -> float:
  return 8.0 + 4.0 * processes


_PROBE = "import sys; from jaxsync._src.app.calibrate import _probe_main; _probe_main(sys.argv[1:])"


def _step_seconds(exp: experiment.Experiment, steps: int, start_at: float | None, slowdown: float = 1.0):
  """Worker 0's step times of ``exp``'s model on its own batches (:func:`probes.step_times`)."""
  from jaxsync._src.calibration import probes

  return probes.step_times(
    exp.loss_fn,
    exp.model.params,
    lambda i: exp.data.batch(0, i),
    steps=steps,
    start_at=start_at,
    slowdown=slowdown,
  )


def _probe_main(argv: list[str]) -> None:
  """One extra compute probe (a subprocess): prints its step times as JSON."""
  config_path, overrides, steps, start_at = argv[0], json.loads(argv[1]), int(argv[2]), float(argv[3])
  slowdown = float(argv[4])
  exp = experiment.build(config_lib.load(pathlib.Path(config_path), overrides))
  print(json.dumps(_step_seconds(exp, steps, start_at, slowdown).tolist()))


def probe_slowdowns(exp: experiment.Experiment, processes: int) -> tuple[float, ...]:
  """Each compute probe's emulated slowdown: probe ``i`` stands for the run's unit ``i``, slow as the run
  emulates it (``cluster.emulate_slow_workers``; 1 otherwise), so the probes share the cores as the run's
  processes do: a slow one sleeps through part of each step's time, as it does in the run."""
  units = exp.slowdowns() or ()
  return tuple(float(units[i]) if i < len(units) else 1.0 for i in range(processes))


_COLLECTIVE = (
  "import sys; from jaxsync._src.app.calibrate import collective_member; collective_member(sys.argv[1:])"
)
_SIZES_KEY = "jaxsync/calibrate/collective_sizes"


def collective_member(argv: list[str]) -> None:
  """One process of the collective probe: ``COORDINATOR PROCESSES INDEX [SIZES_JSON ROUNDS]``.

  Process 0 (given the sizes and rounds) publishes them through the coordination service; the others
  (``jaxsync calibrate --collective-peer``) read them there, so a peer needs no config. Every member
  runs on the CPU backend (gloo), as process 0 does. Process 0 prints ``{"devices": D, "times": {bytes:
  [seconds]}}`` as JSON.
  """
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax

  from jaxsync._src.calibration import probes
  from jaxsync._src.distributed import cluster

  coordinator, processes, index = argv[0], int(argv[1]), int(argv[2])
  cluster.initialize(coordinator=coordinator, num_processes=processes, process_id=index, log=lambda _: None)
  client = cluster.coordination_client()
  if index == 0:
    client.key_value_set(_SIZES_KEY, json.dumps({"sizes": json.loads(argv[3]), "rounds": int(argv[4])}))
  plan = json.loads(client.blocking_key_value_get(_SIZES_KEY, 300_000))
  times = probes.collective_times(plan["sizes"], rounds=plan["rounds"])
  if index == 0:
    out = {"devices": jax.device_count(), "times": {str(n): t.tolist() for n, t in times.items()}}
    print(json.dumps(out), flush=True)
  client.wait_at_barrier("jaxsync/calibrate/collective_done", 300_000)
  if index == 0:
    time.sleep(1.0)  # the others leave first: process 0 hosts the coordination service
  else:
    jax.distributed.shutdown()


def check_address(name: str, value: str) -> str:
  """``value`` if it is ``HOST:PORT`` (a port in 1..65535); a ConfigError naming ``name`` otherwise."""
  host, _, port = str(value).rpartition(":")
  if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
    raise config_lib.ConfigError(f"{name}={value!r} is invalid; expected HOST:PORT, e.g. 10.0.0.1:4398.")
  return value


def collective_probe(
  message_bytes: int,
  processes: int,
  *,
  coordinator: str | None = None,
  rounds: int = 20,
  timeout: float = 900.0,
) -> tuple[dict[int, np.ndarray], int]:
  """All-reduces of 4 KB, a quarter of the message, the message and 4 messages across ``processes`` processes.

  Without ``coordinator`` every process runs on this machine (a free loopback port); with one, only
  process 0 runs here, its coordinator bound at ``coordinator`` (``HOST:PORT``), and the others are
  ``jaxsync calibrate --collective-peer HOST:PORT --collective-processes N --process-id I`` on their hosts.

  Returns:
    ``({bytes: [rounds] seconds}, the devices the all-reduces spanned)``.

  Raises:
    ValueError: ``processes < 2``, ``rounds < 1`` or a bad ``coordinator``.
    RuntimeError: a probe process failed (its error output in the message; the others are stopped) or
      the probe outlasted ``timeout`` seconds.
  """
  import socket
  import tempfile

  processes = validation.check_int("collective_probe", "processes", processes, low=2)
  rounds = validation.check_int("collective_probe", "rounds", rounds, low=1)
  sizes = sorted({4096, max(4, message_bytes // 4), message_bytes, 4 * message_bytes})
  if coordinator is None:
    with socket.socket() as s:
      s.bind(("127.0.0.1", 0))
      coordinator = f"127.0.0.1:{s.getsockname()[1]}"
    members = range(processes)
  else:
    members = range(1)
    check_address("collective_coordinator", coordinator)
  env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
  with tempfile.TemporaryDirectory(prefix="jaxsync-collective-") as tmp:
    logs = [pathlib.Path(tmp) / f"p{i}.log" for i in members]
    started = []
    for i, log in zip(members, logs):
      with log.open("w") as sink:  # files, not pipes: a chatty process never blocks inside a collective
        argv = [sys.executable, "-c", _COLLECTIVE, coordinator, str(processes), str(i)]
        argv += [json.dumps(sizes), str(rounds)] if i == 0 else []
        started.append(subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, text=True, env=env))
    deadline, stopped = time.monotonic() + timeout, set()
    try:
      while any(p.poll() is None for p in started):
        if any(p.poll() not in (None, 0) for p in started) or time.monotonic() > deadline:
          break
        time.sleep(0.1)
    finally:
      for p in started:
        if p.poll() is None:
          stopped.add(id(p))
          p.kill()
          p.wait()
    # The process that failed on its own first, not one stopped here because of it.
    failed = sorted(
      ((i, p, log) for i, p, log in zip(members, started, logs) if p.returncode != 0),
      key=lambda f: id(f[1]) in stopped,
    )
    if failed:
      i, p, log = failed[0]
      tail = " | ".join(log.read_text().strip().splitlines()[-3:])
      why = (
        f"did not finish within {timeout:g} s" if id(p) in stopped else f"failed (exit code {p.returncode})"
      )
      raise RuntimeError(f"calibrate: collective probe process {i} {why}: {tail[-600:]}")
    out = json.loads(logs[0].read_text().strip().splitlines()[-1])
  return {int(n): np.asarray(t) for n, t in out["times"].items()}, int(out["devices"])


def calibrate(
  config_path: pathlib.Path,
  overrides: list[str],
  *,
  processes: int = 1,
  steps: int = 100,
  link_to: str | None = None,
  link_senders: int = 1,
  check_strategy: str | None = None,
  check_gradients: int = 400,
  workdir: pathlib.Path | None = None,
  collective_processes: int | None = None,
  collective_coordinator: str | None = None,
  say=lambda line: None,
) -> tuple[calibration.Calibration, dict[str, Any]]:
  """Measures the config's model on this machine; returns the calibration and the whole config with its
  ``cluster:`` section replaced by the measured one (as plain data, validated).

  With ``link_senders`` ``K > 1`` (and ``link_to``), the echo's card shared
  by ``K`` senders at once (this process and ``K - 1`` ``--stream-peer``
  processes on other hosts) is kept as ``cluster.server_link``.

  With ``collective_processes`` ``P``, all-reduces across ``P`` processes
  (:func:`collective_probe`: on this machine, or with ``collective_coordinator``
  across hosts) give ``collective_overhead``, what each takes beyond the ring
  formula on the measured link (:func:`fit.collective_overhead`).

  With ``check_strategy``, a short real run of the calibrated config on this
  machine (``check_gradients`` gradients) is compared with its simulated runs
  (:func:`check`), and the sentence kept as ``cluster.calibration.check``.

  Raises:
    ConfigError: a bad config, or ``processes`` / ``steps`` out of range.
  """
  cfg = config_lib.load(config_path, overrides)
  if check_strategy is not None and check_strategy not in strategies.names():
    raise config_lib.ConfigError(
      f"--check={check_strategy!r} is not a strategy; expected one of: {', '.join(strategies.names())}."
    )
  if check_strategy is not None:
    if not isinstance(check_gradients, int) or check_gradients < 10:
      raise config_lib.ConfigError(
        f"--check-gradients={check_gradients!r} is invalid; expected an integer >= 10."
      )
  if not isinstance(processes, int) or processes < 1:
    raise config_lib.ConfigError(f"--processes={processes!r} is invalid; expected an integer >= 1.")
  if not isinstance(steps, int) or steps < 10:
    raise config_lib.ConfigError(f"--steps={steps!r} is invalid; expected an integer >= 10.")
  if collective_processes is not None and (
    not isinstance(collective_processes, int)
    or isinstance(collective_processes, bool)
    or collective_processes < 2
  ):
    raise config_lib.ConfigError(
      f"--collective-processes={collective_processes!r} is invalid; expected an integer >= 2 (an all-reduce "
      "needs two processes)."
    )
  if collective_coordinator is not None:
    check_address("--collective-coordinator", collective_coordinator)
  if not isinstance(link_senders, int) or isinstance(link_senders, bool) or link_senders < 1:
    raise config_lib.ConfigError(f"--link-senders={link_senders!r} is invalid; expected an integer >= 1.")
  if link_senders > 1 and link_to is None:
    raise config_lib.ConfigError(
      f"--link-senders={link_senders} needs --link-to tcp://HOST:PORT: an echo on another host "
      "(`jaxsync calibrate --serve-echo PORT`) that the other senders (`--stream-peer`) reach too."
    )
  if collective_coordinator is not None and collective_processes is None:
    raise config_lib.ConfigError(
      f"--collective-coordinator={collective_coordinator!r} needs --collective-processes N (the processes of "
      "the probe, this one included)."
    )
  exp = experiment.build(cfg)
  slowdowns = probe_slowdowns(exp, processes)
  slow = sum(f > 1.0 for f in slowdowns)
  say(
    f"compute: {steps} steps of {cfg.model.name} on batches of {cfg.data.batch_size}, {processes} process(es)"
    + (f", {slow} of them an emulated slow worker" if slow else "")
  )
  start_at = time.time() + _start_slack(processes) if processes > 1 else None
  extra = [
    subprocess.Popen(
      [
        sys.executable,
        "-c",
        _PROBE,
        str(config_path),
        json.dumps(list(overrides)),
        str(steps),
        str(start_at),
        str(slowdowns[i]),
      ],
      stdout=subprocess.PIPE,
      text=True,
      env={**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")},
    )
    for i in range(1, processes)
  ]
  pooled = [_step_seconds(exp, steps, start_at, slowdowns[0])]
  for p in extra:
    out, _ = p.communicate(timeout=600)
    if p.returncode != 0:
      raise RuntimeError(f"calibrate: a compute probe process failed (exit code {p.returncode})")
    pooled.append(np.asarray(json.loads(out)))
  say("link and server: ZeroMQ round trips and the parameter server's time per arrival")
  cal = calibration.calibrate(
    exp.loss_fn,
    exp.model.params,
    lambda i: exp.data.batch(0, i),
    batch_size=cfg.data.batch_size,
    step_seconds=np.concatenate(pooled),
    processes=processes,
    probe_slowdowns=slowdowns,
    link_to=link_to,
    eval_fn=exp.eval_fn,
    link_senders=link_senders,
  )
  if collective_processes is not None:
    say(f"collectives: all-reduces across {collective_processes} processes")
    cal = with_collective_overhead(cal, exp.model.params, collective_processes, collective_coordinator)
  raw = config_lib.apply_overrides(
    config_lib.load_yaml(pathlib.Path(config_path).read_text()) or {}, overrides
  )
  cluster = dict(raw.get("cluster") or {})
  for key in ("device_flops", "message_bytes"):  # the measured compute time and the model's own size rule
    cluster.pop(key, None)
  cluster.update(cal.cluster_section())
  raw["cluster"] = cluster
  config_lib.from_dict(raw)  # what it writes, a run reads
  if check_strategy is not None:
    say(f"check: a real run of {check_strategy} ({check_gradients} gradients) against its simulation")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
      sentence = check(raw, check_strategy, workdir or pathlib.Path(tmp), gradients=check_gradients)
    cluster["calibration"]["check"] = sentence
    cal = dataclasses.replace(cal, sources={**cal.sources, "check": sentence})
  return cal, raw


def with_collective_overhead(
  cal: calibration.Calibration, params, processes: int, coordinator: str | None
) -> calibration.Calibration:
  """``cal`` with ``collective_overhead`` measured by :func:`collective_probe` and its source."""
  import jax

  from jaxsync._src.calibration import fit

  message = int(sum(np.dtype(x.dtype).itemsize * np.size(x) for x in jax.tree.leaves(params)))
  times, devices = collective_probe(message, processes, coordinator=coordinator)
  medians = {n: float(np.median(t)) for n, t in times.items()}
  overhead, excess = fit.collective_overhead(medians, devices, cal.link)
  where = f"across hosts from {coordinator}" if coordinator else "on this machine (loopback)"
  sizes = "; ".join(
    f"{n:,} bytes: {medians[n] * 1e3:.2f} ms, {excess[n] * 1e3:+.2f} ms over the formula"
    for n in sorted(medians)
  )
  source = (
    f"measured: jitted all-reduces (psum) of one buffer across {processes} jax.distributed processes "
    f"({devices} devices) {where}, "
    f"the median of {len(next(iter(times.values())))} each ({sizes}); the median excess over the ring formula "
    f"on the measured link, floored at 0; on {calibration.machine()}"
  )
  return dataclasses.replace(
    cal, collective_overhead=overhead, sources={**cal.sources, "collective_overhead": source}
  )


def simulated_measures(config: config_lib.Config, seeds: int) -> list[agreement.RunMeasures]:
  """The config's simulated run with seeds ``config.seed``, ``+1``, ...: what a real run is compared with."""
  out = []
  for i in range(seeds):
    exp = experiment.build(dataclasses.replace(config, seed=config.seed + i))
    sim = exp.simulator()
    _, records = sim.advance(sim.init(exp.model.params, exp.config.seed), exp.num_events)
    out.append(agreement.measures(records, exp.strategy.gradients_per_event))
  return out


def real_measures(run_dir: pathlib.Path, config: config_lib.Config) -> agreement.RunMeasures:
  """A finished real run's measures, from the event records of its final checkpoint."""
  from jaxsync._src.train.checkpoints import RunCheckpoints

  records = RunCheckpoints(run_dir / "checkpoints", read_only=True).records()
  return agreement.measures(records, experiment.build(config).strategy.gradients_per_event)


def check(
  raw: dict[str, Any], strategy: str, workdir: pathlib.Path, *, gradients: int, seeds: int = 3
) -> str:
  """A short real run of the calibrated config (``jaxsync launch`` on this machine) against its simulated
  runs: one sentence with the errors, for ``cluster.calibration.check``.

  Raises:
    ConfigError: an unknown strategy, or one the config cannot run.
    RuntimeError: the real run failed (its output's end in the message).
  """
  from jaxsync._src.distributed import roles

  workdir.mkdir(parents=True, exist_ok=True)
  path = workdir / "calibrated.yaml"
  path.write_text(dump(raw))
  base = config_lib.load(path)
  options = experiment.for_strategy(base, strategy, base.seed).strategy.options
  overrides = [
    f"strategy.name={strategy}",
    f"strategy.options={json.dumps(options)}",
    f"run.gradients={gradients}",
    "run.checkpoint_every=null",
  ]
  cfg = config_lib.load(path, overrides)
  exp = experiment.build(cfg)
  processes = exp.strategy.num_units + (1 if roles.serves(exp.strategy) else 0)
  argv = [sys.executable, "-m", "jaxsync.cli", "launch", "-n", str(processes), str(path)]
  argv += [f"--set={o}" for o in overrides] + ["--out", str(workdir / "real"), "--overwrite"]
  done = subprocess.run(argv + ["--progress", "quiet"], capture_output=True, text=True, timeout=900)
  if done.returncode != 0:
    raise RuntimeError(
      f"calibrate --check: the real run failed (exit code {done.returncode}):\n{done.stderr[-2000:]}"
    )
  c = agreement.compare(
    real_measures(workdir / "real", cfg), simulated_measures(cfg, seeds), target=cfg.run.target_accuracy
  )
  return describe_check(c, strategy=strategy, gradients=gradients, processes=processes, seeds=seeds)


def describe_check(c: dict, *, strategy: str, gradients: int, processes: int, seeds: int) -> str:
  """One sentence of :func:`agreement.compare`'s numbers."""

  def pct(x):
    return "-" if x is None else f"{100 * x:+.0f}%"

  def num(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"

  g, t, st, acc = c["gradients_per_second"], c["time_to_target"], c["staleness"], c["accuracy_at_equal_time"]
  return (
    f"{strategy}, {gradients} gradients on {processes} processes of this machine against {seeds} simulated "
    f"seeds ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}): gradients/s real {num(g['real'], 0)}, "
    f"simulated {num(g['simulated'], 0)} ({pct(g['error'])}); mean staleness {num(st['real'])} vs "
    f"{num(st['simulated'])} (total variation {num(st['total_variation'])}); time to accuracy "
    f"{t['target']:g} real {num(t['real'])} s, simulated {num(t['simulated'])} s ({pct(t['error'])}); accuracy "
    f"after {acc['seconds']:.1f} s real {num(acc['real'], 3)}, simulated {num(acc['simulated'], 3)}; the real "
    f"run's {c['start']:.1f} s of start-up (processes, compiling) are not simulated"
  )


def dump(raw: dict[str, Any]) -> str:
  """A config as YAML, sections in their usual order."""
  return yaml.safe_dump(raw, sort_keys=False, width=110)


def command(args) -> int:
  """``jaxsync calibrate``'s command line (``args`` from ``jaxsync.cli``): an echo, a peer of another
  host's probe, or the calibration of a config, printed and written to ``--out``."""
  if args.serve_echo is not None:
    from jaxsync._src.calibration.probes import EchoServer

    echo = EchoServer(args.bind, args.serve_echo)
    print(f"jaxsync calibrate: echoing at {echo.address} until stopped (Ctrl-C)", file=sys.stderr, flush=True)
    echo.serve_forever()
    return 0
  if args.stream_peer is not None:
    from jaxsync._src.calibration.probes import stream_peer

    if args.config is not None:
      raise config_lib.ConfigError(
        f"--stream-peer takes no CONFIG (got {str(args.config)!r}): the calibrating host sets the message size."
      )
    print(
      f"jaxsync calibrate: a sender to {args.stream_peer} when its probe is on", file=sys.stderr, flush=True
    )
    sent = stream_peer(args.stream_peer)
    print(f"jaxsync calibrate: sent {sent} messages to {args.stream_peer}", file=sys.stderr)
    return 0
  if args.collective_peer is not None:
    n, i = args.collective_processes, args.process_id
    if n is None or n < 2 or i is None or not 1 <= i < n:
      raise config_lib.ConfigError(
        f"--collective-peer needs --collective-processes N >= 2 and --process-id between 1 and N - 1 "
        f"(got --collective-processes={n}, --process-id={i}); process 0 is the calibrating host's."
      )
    if args.config is not None:
      raise config_lib.ConfigError(
        f"--collective-peer takes no CONFIG (got {str(args.config)!r}): process 0 sends the sizes to time."
      )
    check_address("--collective-peer", args.collective_peer)
    collective_member([args.collective_peer, str(n), str(i)])
    return 0
  if args.process_id is not None:
    raise config_lib.ConfigError(
      f"--process-id={args.process_id} is only for --collective-peer HOST:PORT (another host's collective probe)."
    )
  if args.config is None:
    raise config_lib.ConfigError(
      "calibrate needs a CONFIG (or --serve-echo PORT); e.g. configs/quickstart.yaml"
    )
  if args.out is not None and args.out.exists() and args.out.resolve() == args.config.resolve():
    raise config_lib.ConfigError(f"--out={str(args.out)!r} is the config itself; give another file.")
  cal, raw = calibrate(
    args.config,
    args.overrides,
    processes=args.processes,
    steps=args.steps,
    link_to=args.link_to,
    link_senders=args.link_senders,
    check_strategy=args.check,
    check_gradients=args.check_gradients,
    collective_processes=args.collective_processes,
    collective_coordinator=args.collective_coordinator,
    say=lambda line: print(f"jaxsync calibrate: {line}", file=sys.stderr, flush=True),
  )
  print(dump({"cluster": cal.cluster_section()}), end="")
  if args.out is not None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
      f"# {args.config} with its cluster measured by `jaxsync calibrate` (see cluster.calibration)\n"
      + dump(raw)
    )
    print(f"jaxsync calibrate: wrote {args.out}", file=sys.stderr)
  return 0
