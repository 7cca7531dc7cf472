"""``jaxsync calibrate``: this machine measured, written as a cluster section, and checked against a real run."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from jaxsync import cli
from jaxsync._src.app import calibrate, experiment
from jaxsync._src.app import config as config_lib
from jaxsync._src.train.checkpoints import RunCheckpoints

QUICKSTART = pathlib.Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"
# The quickstart's CNN with two workers, the second 3x slower: on real processes too.
TWO = [
  "cluster.num_workers=2",
  "cluster.slow_fraction=0.5",
  "cluster.slowdown=3",
  "cluster.emulate_slow_workers=true",
  "run.eval_every_time=0.5",
  "run.target_accuracy=0.5",
]


@pytest.mark.heavy
def test_calibrate_measures_writes_a_cluster_a_run_takes_and_checks_it_against_a_real_run(tmp_path):
  cal, raw = calibrate.calibrate(
    QUICKSTART, TWO, steps=20, check_strategy="asp", check_gradients=240, workdir=tmp_path / "check"
  )
  # Measured numbers, in range, each with where it came from.
  assert 1e-5 < cal.compute_time < 1.0 and cal.jitter_shape > 0
  assert cal.link.bandwidth > 1e6 and cal.link.latency >= 0 and cal.apply_time >= 0
  cluster = raw["cluster"]
  assert cluster["compute_time"] == pytest.approx(cal.compute_time, rel=1e-3)
  assert set(cluster["calibration"]) >= {"compute_time", "jitter_shape", "link", "apply_time", "check"}
  assert "20 steps of the model's gradient" in cluster["calibration"]["compute_time"]
  # What it writes, a run reads: the simulator's clock is the measured one.
  cfg = config_lib.from_dict(raw)
  exp = experiment.build(cfg)
  assert exp.time_model.link.bandwidth == pytest.approx(cal.link.bandwidth, rel=1e-3)
  assert float(exp.time_model.mean_compute_times()[0]) == pytest.approx(cal.compute_time, rel=1e-3)
  # The check: a real two-worker run, its numbers in one sentence.
  check = cluster["calibration"]["check"]
  assert check.startswith("asp, 240 gradients on 3 processes of this machine against 3 simulated seeds")
  assert "gradients/s real " in check and "time to accuracy 0.5" in check
  # ... whose slow worker was really slower: about a third of the arrivals of the fast one.
  records = RunCheckpoints(tmp_path / "check" / "real" / "checkpoints", read_only=True).records()
  arrivals = np.bincount(records.worker, minlength=2)
  assert arrivals.sum() == 240
  assert 1.5 < arrivals[0] / arrivals[1] < 6.0, arrivals  # equal speeds would give about 1
  # The advisor says where its clock came from.
  from jaxsync._src.app import commands

  note = commands.clock_note(cfg.cluster)
  assert note.startswith("The clock was measured") and "against a real run: asp, 240 gradients" in note


def test_the_clock_note_of_presets_says_they_are_not_measured():
  from jaxsync._src.app import commands

  note = commands.clock_note(config_lib.load(QUICKSTART).cluster)
  assert note.startswith("The clock is the config's presets (0.01 s per step, 10gbps), not measured")
  assert "jaxsync calibrate" in note


def _run(capsys, *argv):
  code = cli.main([str(a) for a in argv])
  out, err = capsys.readouterr()
  return code, out, err


@pytest.mark.parametrize(
  ("argv", "words"),
  [
    (["calibrate"], ["calibrate needs a CONFIG", "--serve-echo"]),
    (["calibrate", QUICKSTART, "--check", "warp"], ["--check='warp' is not a strategy", "ormo"]),
    (["calibrate", QUICKSTART, "--processes", "0"], ["--processes=0", "integer >= 1"]),
    (["calibrate", QUICKSTART, "--steps", "3"], ["--steps=3", "integer >= 10"]),
    (["calibrate", QUICKSTART, "--out", QUICKSTART], ["is the config itself"]),
    (["calibrate", QUICKSTART, "--set", "cluster.link=5gbps"], ["cluster.link='5gbps'"]),
    (["calibrate", QUICKSTART, "--collective-processes", "1"], ["--collective-processes=1", "integer >= 2"]),
    (["calibrate", QUICKSTART, "--collective-coordinator", "h:1"], ["needs --collective-processes N"]),
    (["calibrate", "--collective-peer", "h:1", "--collective-processes", "3"], ["--process-id=None"]),
    (
      ["calibrate", "--collective-peer", "h:1", "--collective-processes", "3", "--process-id", "0"],
      ["--process-id between 1 and N - 1"],
    ),
    (
      ["calibrate", QUICKSTART, "--set", "cluster.collective_overhead=-1"],
      ["cluster.collective_overhead=-1"],
    ),
    (["calibrate", QUICKSTART, "--process-id", "1"], ["--process-id=1 is only for --collective-peer"]),
    (["calibrate", QUICKSTART, "--link-senders", "3"], ["--link-senders=3 needs --link-to", "--stream-peer"]),
    (["calibrate", QUICKSTART, "--link-senders", "0"], ["--link-senders=0 is invalid", "integer >= 1"]),
    (["calibrate", QUICKSTART, "--stream-peer", "tcp://h:1"], ["--stream-peer takes no CONFIG"]),
    (
      ["calibrate", QUICKSTART, "--set", "cluster.server_link=5gbps"],
      ["cluster.server_link='5gbps'", "100mbps"],
    ),
    (
      ["calibrate", QUICKSTART, "--set", 'cluster.server_link={"latency": 0, "bandwidth": -1}'],
      ["cluster.server_link.bandwidth=-1.0 is invalid", "bytes per second > 0"],
    ),
    (
      ["calibrate", QUICKSTART, "--collective-processes", "3", "--collective-coordinator", "hostA"],
      ["--collective-coordinator='hostA'", "HOST:PORT"],
    ),
    (
      [
        "calibrate",
        QUICKSTART,
        "--collective-peer",
        "h:1",
        "--collective-processes",
        "3",
        "--process-id",
        "1",
      ],
      ["takes no CONFIG"],
    ),
  ],
)
def test_calibrate_refuses_bad_command_lines_in_one_line(capsys, argv, words):
  code, _, err = _run(capsys, *argv)
  assert code == 2 and err.startswith("jaxsync: error: ") and err.count("\n") == 1, err
  for word in words:
    assert word in err


@pytest.mark.heavy
def test_the_collective_probe_times_all_reduces_across_processes_and_calibrate_writes_what_a_run_charges():
  from jaxsync._src.calibration import calibration
  from jaxsync._src.sim.time_model import Link

  times, devices = calibrate.collective_probe(40_000, 2, rounds=5)
  assert devices == 2 and sorted(times) == [4096, 10_000, 40_000, 160_000]
  assert all(t.shape == (5,) and (t > 0).all() and (t < 5.0).all() for t in times.values())
  # Kept with its source in the cluster section a config takes, and charged per all-reduce round.
  two = ["strategy.name=allreduce", "cluster.num_workers=2"]
  exp = experiment.build(config_lib.load(QUICKSTART, two))
  cal = calibration.Calibration(
    compute_time=0.01,
    jitter_shape=50.0,
    link=Link(1e-4, 1e8),
    apply_time=0.0,
    server_bandwidth=None,
    sources={},
  )
  measured = calibrate.with_collective_overhead(cal, exp.model.params, 2, None)
  section = measured.cluster_section()
  assert section["collective_overhead"] == pytest.approx(measured.collective_overhead, rel=1e-3, abs=1e-9)
  assert 0.0 <= measured.collective_overhead < 1.0
  source = section["calibration"]["collective_overhead"]
  assert "across 2 jax.distributed processes (2 devices) on this machine" in source
  charged = experiment.build(config_lib.load(QUICKSTART, [*two, "cluster.collective_overhead=0.25"]))
  sized = [e.time_model.with_message_bytes(e.model.params) for e in (charged, exp)]
  extra = sized[0].round_time(charged.strategy, 2) - sized[1].round_time(exp.strategy, 2)
  assert extra == pytest.approx(0.25)


@pytest.mark.parametrize(
  ("kwargs", "match"),
  [
    ({"processes": 1}, "processes=1"),
    ({"processes": 2, "rounds": 0}, "rounds=0"),
    ({"processes": 2, "coordinator": "nohost"}, "expected HOST:PORT"),
  ],
)
def test_the_collective_probe_refuses_bad_arguments_before_starting_anything(kwargs, match):
  with pytest.raises(ValueError, match=match):
    calibrate.collective_probe(4096, **kwargs)


def test_a_compute_probe_standing_for_a_slow_worker_sleeps_between_its_steps_as_the_run_does():
  import time

  import jax.numpy as jnp

  from jaxsync._src.calibration import calibration, probes

  params = jnp.ones(4096)

  def loss(p, batch):
    return jnp.sum((p * batch) ** 2)

  began = time.perf_counter()
  times = probes.step_times(loss, params, lambda i: jnp.full(4096, float(i)), steps=5, slowdown=4.0)
  wall = time.perf_counter() - began
  assert times.shape == (5,) and np.all(times > 0)
  # Each step is followed by 3x its own time asleep: the probe spends at least 4x its steps' time.
  assert wall >= 4.0 * times.sum()
  with pytest.raises(ValueError, match="slowdown=0.5"):
    probes.step_times(loss, params, lambda i: params, steps=2, slowdown=0.5)
  _, _, source = calibration.compute_from(times, processes=3, batch_size=8, probe_slowdowns=(1.0, 1.0, 4.0))
  assert (
    "3 process(es) at once (1 of them an emulated slow worker, sleeping 3x each step as in a run)" in source
  )
  _, _, plain = calibration.compute_from(times, processes=3, batch_size=8)
  assert "3 process(es) at once on " in plain


def test_compute_probe_i_stands_for_the_runs_unit_i_slow_where_the_run_emulates_it():
  emulated = experiment.build(config_lib.load(QUICKSTART, TWO))
  assert calibrate.probe_slowdowns(emulated, 2) == (1.0, 3.0)
  assert calibrate.probe_slowdowns(emulated, 3) == (1.0, 3.0, 1.0)  # more probes than workers: fast
  assert calibrate.probe_slowdowns(emulated, 1) == (1.0,)
  plain = experiment.build(config_lib.load(QUICKSTART, [*TWO, "cluster.emulate_slow_workers=false"]))
  assert calibrate.probe_slowdowns(plain, 2) == (1.0, 1.0)


def test_round_trips_after_an_idle_pause_wait_it_out_before_each_and_time_only_the_trip():
  import time

  from jaxsync._src.calibration import probes

  echo = probes.EchoServer().start()
  try:
    address = echo.address
    began = time.perf_counter()
    trips = probes.round_trips(address, [4096], rounds=3, warmup=1, pause=0.05)[4096]
    wall = time.perf_counter() - began
    assert trips.shape == (3,) and np.all(trips > 0)
    assert wall >= 4 * 0.05  # the pause before each of the 4 trips (1 warm-up), not inside the times
    assert trips.max() < 0.05
    with pytest.raises(ValueError, match="pause=-1"):
      probes.round_trips(address, [4096], pause=-1.0)
  finally:
    echo.stop()


def test_the_shared_card_probe_counts_what_the_echo_moved_while_every_sender_sent_and_a_run_charges_it():
  import threading

  from jaxsync._src.calibration import calibration, probes
  from jaxsync._src.sim.time_model import Link

  echo = probes.EchoServer().start()
  try:
    peer = threading.Thread(
      target=probes.stream_peer, args=(echo.address,), kwargs={"lifetime": 30.0, "timeout": 1.0}
    )
    peer.start()
    got = probes.shared_card(echo.address, 100_000, 2, seconds=0.5, warmup=0.2)
    assert got["senders"] == 2 and got["messages"] > 4 and 0.45 < got["seconds"] < 1.5
    assert got["bytes"] == got["messages"] * 100_000  # only the probe's own messages, each counted once
    # Off again: the peer idles, and a probe waiting for a third sender names what is missing.
    with pytest.raises(
      RuntimeError, match=r"expected 3 senders .* but 2 sent; start `jaxsync calibrate --stream-peer"
    ):
      probes.shared_card(echo.address, 100_000, 3, seconds=0.2, warmup=0.1)
    link = Link(latency=1e-4, bandwidth=got["bytes"] / got["seconds"] * 2)
    shared, source = calibration.measure_shared_card(
      100_000, link, link_to=echo.address, senders=2, seconds=0.5
    )
  finally:
    echo.stop()
    peer.join(timeout=10)
  assert shared.latency == link.latency and 0 < shared.bandwidth
  assert (
    "2 senders at once" in source and f"({shared.bandwidth / link.bandwidth:.2f}x one stream's)" in source
  )
  # Kept in the cluster section, which a config reads back as the server's card.
  cal = calibration.Calibration(
    compute_time=0.01,
    jitter_shape=50.0,
    link=link,
    apply_time=0.0,
    server_bandwidth=None,
    sources={},
    server_link=shared,
  )
  section = cal.cluster_section()
  exp = experiment.build(config_lib.load(QUICKSTART, [f"cluster.server_link={section['server_link']}"]))
  assert exp.time_model.server_link.bandwidth == pytest.approx(shared.bandwidth, rel=1e-3)
