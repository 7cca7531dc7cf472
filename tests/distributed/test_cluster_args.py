"""Membership arguments and process counts: refused up front with the value and what is valid."""

from __future__ import annotations

import json

import pytest

from jaxsync._src.app import commands
from jaxsync._src.app import config as config_lib
from jaxsync._src.app.config import ConfigError
from jaxsync._src.distributed import cluster
from jaxsync._src.strategies import registry as strategies

import helpers


@pytest.mark.parametrize(
  "kwargs, words",
  [
    ({"coordinator": "10.0.0.1:4321"}, "missing --num-processes, --process-id"),
    ({"coordinator": "10.0.0.1:4321", "num_processes": 0, "process_id": 0}, "--num-processes=0"),
    ({"coordinator": "10.0.0.1:4321", "num_processes": 2, "process_id": 2}, "0 <= id < 2"),
    ({"coordinator": "10.0.0.1", "num_processes": 2, "process_id": 0}, "expected HOST:PORT"),
  ],
)
def test_incomplete_or_invalid_membership_is_refused_before_joining(kwargs, words):
  with pytest.raises(cluster.ClusterError, match=words):
    cluster.initialize(**kwargs)


def test_no_membership_and_no_cluster_means_the_simulator(monkeypatch):
  for name in (cluster.ENV_COORDINATOR, "SLURM_JOB_ID", "KUBERNETES_SERVICE_HOST"):
    monkeypatch.delenv(name, raising=False)
  assert cluster.initialize(log=lambda _: None) is None


@pytest.mark.parametrize("raw", ["0", "soon"])
def test_a_bad_heartbeat_timeout_names_the_variable(monkeypatch, raw):
  monkeypatch.setenv(cluster.ENV_HEARTBEAT_TIMEOUT, raw)
  with pytest.raises(cluster.ClusterError, match=f"JAXSYNC_HEARTBEAT_TIMEOUT='{raw}'"):
    cluster.heartbeat_timeout()


def test_an_async_run_needs_one_process_more_than_workers():
  with pytest.raises(ConfigError, match="launch 4 processes, or set cluster.num_workers=2"):
    commands.check_processes(strategies.make("asp", 3), 3)
  commands.check_processes(strategies.make("asp", 3), 4)
  # EA-wild in groups of 2: one worker process per group.
  groups = strategies.make("ea_wild", 4, group_size=2)
  commands.check_processes(groups, 3)
  with pytest.raises(
    ConfigError,
    match=r"one group of 2 workers \(group_size=2\) per other process; launch 3 processes, or set cluster.num_workers=8",
  ):
    commands.check_processes(groups, 5)
  with pytest.raises(ConfigError, match="one worker per device"):
    commands.check_processes(strategies.make("bsp", 2), 2)  # this test process has one device


def test_only_launch_run_directories_are_relaunched_locally(tmp_path):
  assert commands.launched_processes(tmp_path) is None
  (tmp_path / "launch.json").write_text(json.dumps({"num_processes": 3, "how": "launch"}))
  assert commands.launched_processes(tmp_path) == 3
  (tmp_path / "launch.json").write_text(json.dumps({"num_processes": 8, "how": "SlurmCluster"}))
  assert commands.launched_processes(tmp_path) is None


def test_launch_drops_only_the_routine_library_notes():
  from jaxsync._src.distributed import launch

  assert launch.is_noise(
    "W1123 14:57:49.796136   13016 coordination_service.cc:185] [290] Using experimental recoverable task feature."
  )
  assert launch.is_noise(
    "[Gloo] Rank 1 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1"
  )
  for kept in (
    "jaxsync.server: worker 1 (process 2) lost at 3.2 s, server version 812",
    "E1123 14:57:49 coordination_service.cc:400] Task /job:jax_worker/task:1 heartbeat timeout",
    "[Gloo] connection to 127.0.0.1 failed",
  ):
    assert not launch.is_noise(kept), kept


def test_a_sharded_server_adds_its_shards_to_the_process_count():
  with pytest.raises(ConfigError, match=r"runs 2 server shards \(processes 0-1\).*launch 5 processes"):
    commands.check_processes(strategies.make("asp", 3), 4, servers=2)
  commands.check_processes(strategies.make("asp", 3), 5, servers=2)
  with pytest.raises(
    ConfigError, match=r"cluster.servers=2 is invalid for the sync strategy 'bsp'.*expected 1"
  ):
    commands.check_processes(strategies.make("bsp", 1), 1, servers=2)


@pytest.mark.parametrize("value, shown", [("0", "0"), ("1.5", "1.5"), ("two", "'two'")])
def test_cluster_servers_takes_a_whole_number_of_processes(value, shown):
  with pytest.raises(ConfigError, match=f"cluster.servers={shown} is invalid"):
    config_lib.load(helpers.QUICKSTART, [f"cluster.servers={value}"])


@pytest.mark.parametrize("raw", ["-1", "soon", "nan"])
def test_a_bad_rejoin_wait_is_refused_naming_the_variable(monkeypatch, raw):
  monkeypatch.setenv(cluster.ENV_REJOIN_WAIT, raw)
  with pytest.raises(cluster.ClusterError, match=f"JAXSYNC_REJOIN_WAIT='{raw}' is invalid; expected seconds"):
    cluster.rejoin_wait()


def test_the_rejoin_wait_is_read_from_the_environment_and_is_zero_without_a_supervisor(monkeypatch):
  monkeypatch.delenv(cluster.ENV_REJOIN_WAIT, raising=False)
  assert cluster.rejoin_wait() == 0.0
  monkeypatch.setenv(cluster.ENV_REJOIN_WAIT, "120")
  assert cluster.rejoin_wait() == 120.0


@pytest.mark.parametrize(
  "kwargs, words",
  [
    ({"max_restarts": -1, "run_dir": "r"}, "max_restarts=-1"),
    ({"max_restarts": 2}, "max_restarts needs run_dir"),
    ({"max_restarts": 1, "run_dir": "r", "settle": -5.0}, "settle=-5.0"),
    ({"max_restarts": 1, "run_dir": "r", "rejoin_delay": -1.0}, "rejoin_delay=-1.0"),
    ({"max_restarts": 1, "run_dir": "r", "rejoin_delay": float("inf")}, "rejoin_delay=inf"),
  ],
)
def test_a_bad_restart_policy_is_refused_naming_the_value(kwargs, words):
  from jaxsync._src.distributed.launch import RestartPolicy

  with pytest.raises(ValueError, match=words):
    RestartPolicy(**kwargs)


@pytest.mark.parametrize(
  "name, options, workers, processes, servers, alone, kept_down",
  [
    ("asp", {}, 3, 4, 1, {1, 2, 3}, set()),  # workers rejoin the running server
    ("diloco", {"membership": "elastic"}, 3, 4, 1, {1, 2, 3}, set()),  # elastic rounds: the same (churn)
    ("asp", {}, 2, 4, 2, {2, 3}, set()),  # shards restart the run
    ("allreduce", {}, 4, 4, 1, set(), set()),  # every process of a synchronous run restarts the run
    ("inhad", {"local_workers": 2}, 4, 5, 1, set(), {1, 2, 3, 4}),  # left down: the server drops the node
  ],
)
def test_the_supervisor_restarts_workers_alone_and_everything_else_with_the_run(
  name, options, workers, processes, servers, alone, kept_down
):
  from jaxsync._src.distributed import roles

  strategy = strategies.make(name, workers, **options)
  got = roles.restart_roles(strategy, processes, servers)
  assert (set(got.alone), set(got.kept_down)) == (alone, kept_down)
  assert got.settle == (90.0 if name == "allreduce" else 15.0)
  # A synchronous run's coordination service runs in the launcher: process 0 may die like another process.
  assert got.host_service == (name == "allreduce")
