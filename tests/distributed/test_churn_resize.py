"""A synchronous run that shrinks to its survivors and grows back (`jaxsync launch --min-workers`): the
membership record, the config of each size, the checkpoint carried from one size to another, and the bad
options. The launcher's whole cycle on real processes is in test_multiprocess.py (heavy)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from jaxsync._src.app import commands, resize
from jaxsync._src.app import config as config_lib
from jaxsync._src.distributed import membership, sync_runtime
from jaxsync._src.distributed.launch import RestartPolicy
from jaxsync._src.distributed.membership import Segment

import helpers


def test_churn_membership_record_maps_each_worker_back_through_every_shrink_and_grow(tmp_path):
  assert membership.read(tmp_path, 4) == [Segment(0, 4)]  # no file: the config's size, from the start
  membership.append(tmp_path, Segment(120, 3, (0, 1, 3)), why="shrink")  # worker 2 lost
  membership.append(tmp_path, Segment(300, 2, (2, 0)), why="shrink")  # then worker 1; rows reordered
  membership.append(tmp_path, Segment(450, 4, (0, 1, None, None)), why="grow")
  segments = membership.read(tmp_path, 4)
  assert [s.workers for s in segments] == [4, 3, 2, 4]
  assert membership.row_sources(segments, 0) == [3, 0, None, None]
  assert membership.row_sources(segments, 1) == [2, 0, None, None]
  assert membership.row_sources(segments, 3) == [0, 1, 2, 3]


@pytest.mark.parametrize(
  "segment, words",
  [
    (Segment(10, 2, (0,)), "workers=2 with 1 kept"),
    (Segment(10, 2, (0, 5)), "kept=[0, 5]"),
    (Segment(10, 2, (1, 1)), "names a worker twice"),
  ],
)
def test_churn_a_membership_record_that_cannot_follow_is_refused_naming_it(tmp_path, segment, words):
  with pytest.raises(ValueError, match=re.escape(words)):
    membership.check(Segment(0, 3), segment)
  (tmp_path / membership.MEMBERSHIP_FILE).write_text('{"from_event": 5, "workers": "two"}\n')
  with pytest.raises(ValueError, match=r"membership.jsonl:1: .* is not a membership record"):
    membership.read(tmp_path, 3)


def _config(*overrides):
  base = ["cluster.num_workers=4", "data.batch_size=32", "run.gradients=4000"]
  return config_lib.load(helpers.QUICKSTART, [*base, *overrides])


def test_churn_shrinking_keeps_the_global_batch_and_the_examples_budget():
  config = _config("strategy.name=allreduce", "strategy.options={learning_rate: 0.1}")
  shrunk = resize.resized_config(config, [Segment(0, 4), Segment(100, 3, (0, 1, 3))])
  # round(32 x 4 / 3) = 43 examples per worker; the budget is 4000 x 32 examples: 100 rounds of 128, then
  # what is left at 3 x 43 = 129 per round, ceil(115,200 / 129) = 894 rounds more.
  assert (shrunk.cluster.num_workers, shrunk.data.batch_size) == (3, 43)
  assert shrunk.strategy.options["learning_rate"] == 0.1
  assert shrunk.run.gradients == (100 + 894) * 3
  regrown = resize.resized_config(
    config, [Segment(0, 4), Segment(100, 3, (0, 1, 3)), Segment(400, 4, (0, 1, 2, None))]
  )
  # 300 rounds of 129 at 3 workers: 128,000 - 12,800 - 38,700 = 76,500 examples left, 598 rounds of 128.
  assert (regrown.cluster.num_workers, regrown.data.batch_size, regrown.run.gradients) == (
    4,
    32,
    (400 + 598) * 4,
  )
  line = resize.describe(config, shrunk, [Segment(0, 4), Segment(100, 3, (0, 1, 3))])
  assert line == (
    "3 of 4 workers from round 100 (cluster.shrink_keeps=global_batch): batch per worker 43 (config 32), "
    "129 examples per round (config 128), learning rate unchanged; 994 rounds in all"
  )


def test_churn_shrinking_the_worker_batch_scales_an_averaged_gradients_rate_and_not_a_local_one():
  segments = [Segment(0, 4), Segment(100, 2, (0, 1))]
  config = _config(
    "strategy.name=allreduce", "strategy.options={learning_rate: 0.1}", "cluster.shrink_keeps=worker_batch"
  )
  shrunk = resize.resized_config(config, segments)
  assert (shrunk.data.batch_size, shrunk.strategy.options["learning_rate"]) == (32, 0.05)  # x 2/4
  assert shrunk.run.gradients == 100 * 2 + (4000 - 400)  # every gradient left, 2 per round
  assert "learning rate 0.05 (x 2/4, the linear scaling rule)" in resize.describe(config, shrunk, segments)
  local = _config("strategy.name=diloco", "strategy.options={period: 5}", "cluster.shrink_keeps=worker_batch")
  shrunk = resize.resized_config(local, segments)
  assert "learning_rate" not in shrunk.strategy.options  # each worker's own steps: its rate stays
  assert shrunk.run.gradients == 100 * 10 + (4000 - 100 * 20)  # 10 gradients per round at 2 workers
  with pytest.raises(config_lib.ConfigError, match="cluster.shrink_keeps='global'"):
    _config("cluster.shrink_keeps=global")


def test_churn_a_resized_state_keeps_the_global_model_and_maps_each_workers_local_one():
  saved = sync_runtime.SyncState(
    clock=np.float32(7.5), params={"w": np.array([1.0, 2.0])}, rule_state=(np.float32(3.0),),
    version=np.int32(40), steps=np.array([400, 400, 400], np.int32),
    worker_params={"w": np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])},
    worker_state={"m": np.array([[0.1], [0.2], [0.3]])},
    next_eval=np.int32(50), event=np.int32(40),
  )  # fmt: skip
  out = sync_runtime.resized_state(
    saved, (2, None, 0), batch_size=16, new_batch_size=24, fresh_worker_state={"m": np.array([0.0])}
  )
  np.testing.assert_array_equal(out.worker_params["w"], [[3.0, 3.0], [1.0, 2.0], [1.0, 1.0]])
  np.testing.assert_array_equal(out.worker_state["m"], [[0.3], [0.0], [0.1]])
  np.testing.assert_array_equal(out.steps, [266, 266, 266])  # 1200 x 16 examples = 266.7 batches of 3 x 24
  assert out.params is saved.params and out.rule_state is saved.rule_state and int(out.event) == 40
  allreduce = saved._replace(worker_params=(), worker_state=())
  out = sync_runtime.resized_state(allreduce, (0, 1), batch_size=16, new_batch_size=24, fresh_worker_state=())
  assert out.worker_params == () and out.steps.tolist() == [400, 400]


# Three workers train and checkpoint; the run goes on with two (worker 1 lost), then with three again; on
# four CPU devices of one process, through the training loop's restore (in a subprocess for its devices).
_RUN = textwrap.dedent(
  """
  import json, os, pathlib, sys
  os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
  import jax, jax.numpy as jnp, numpy as np, optax
  import jaxsync
  from jaxsync._src.distributed import sync_runtime
  from jaxsync._src.train import training
  from jaxsync._src.train.checkpoints import RunCheckpoints

  rng = np.random.default_rng(0)
  x = rng.normal(size=(480, 20)).astype(np.float32)
  y = np.argmax(x @ rng.normal(size=(20, 5)), axis=1).astype(np.int32)
  params = {"w": jnp.zeros([20, 5], jnp.float32), "b": jnp.zeros([5], jnp.float32)}
  loss = lambda p, b: optax.softmax_cross_entropy_with_integer_labels(b["x"] @ p["w"] + p["b"], b["y"]).mean()
  run_dir = pathlib.Path(sys.argv[1])
  out = {}

  def runtime(k, batch, earlier=()):
    strategy = jaxsync.strategies.make("local_sgd", k, learning_rate=0.1, momentum=0.9, period=2)
    data = jaxsync.sim.WorkerData({"x": x, "y": y}, num_workers=k, batch_size=batch, seed=0)
    return sync_runtime.SyncRuntime(strategy, loss, data, devices=jax.devices()[:k], earlier=earlier)

  def checkpoint(like):
    ckpt = RunCheckpoints(run_dir / "checkpoints", read_only=True)
    state, _, progress = ckpt.restore(like)
    ckpt.close()
    return jax.tree.map(np.asarray, state), progress["events"]

  def preempted(runtime, chunks):  # trains until a preemption notice after `chunks` chunks of 2 rounds
    asked = []
    try:
      training.train(runtime, params, run_dir, num_events=14, log_every=2, stop_requested=lambda: asked.append(1) or len(asked) >= chunks)
    except training.PreemptedError as err:
      return err.done

  three = runtime(3, 8)
  out["first_stop"] = preempted(three, 3)
  before, events = checkpoint(three.init(params))
  two = runtime(2, 12, earlier=(sync_runtime.EarlierShape(6, 3, 8, (0, 2)),))
  ckpt = RunCheckpoints(run_dir / "checkpoints", read_only=True)
  restored = training._restore_or_start(two, params, 0, ckpt).state
  ckpt.close()
  out["shrunk_rows"] = bool(np.array_equal(np.asarray(restored.worker_params["w"]), before.worker_params["w"][[0, 2]]))
  out["shrunk_global"] = bool(np.array_equal(np.asarray(restored.params["w"]), before.params["w"]))
  out["shrunk_steps"] = np.asarray(restored.steps).tolist()
  out["before_steps"] = before.steps.tolist()
  out["second_stop"] = preempted(two, 2)
  three_again = runtime(3, 8, earlier=(sync_runtime.EarlierShape(10, 2, 12, (0, 1, None)), sync_runtime.EarlierShape(0, 3, 8, (0, 2, None))))
  result = training.train(three_again, params, run_dir, num_events=14, log_every=2)
  ckpt = RunCheckpoints(run_dir / "checkpoints", read_only=True)
  out["grown_events"] = [int(e) for e in np.asarray(ckpt.records().version)][-6:]
  ckpt.close()
  out["grown_summary_events"] = int(result.summary["events"])
  try:
    runtime(2, 12).init(params)
    training.train(runtime(2, 12), params, run_dir, num_events=16, log_every=2)
    out["unrelated"] = "restored"
  except Exception as err:
    out["unrelated"] = str(err)
  print(json.dumps(out))
  """
)


def test_churn_a_checkpoint_of_three_workers_goes_on_with_two_and_then_three_again(tmp_path):
  done = subprocess.run(
    [sys.executable, "-c", _RUN, str(tmp_path / "run")],
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  out = json.loads(done.stdout.splitlines()[-1])
  # Worker 1 lost: the two left keep workers 0 and 2's local models; the global model is the checkpoint's.
  assert out["shrunk_rows"] and out["shrunk_global"], out
  assert out["before_steps"] == [12, 12, 12]  # 6 rounds of 2 local steps
  assert out["shrunk_steps"] == [12, 12]  # 3 x 12 x 8 examples = 2 x 12 batches of 12: the same place
  assert (out["first_stop"], out["second_stop"], out["grown_summary_events"]) == (6, 10, 14)
  assert out["grown_events"] == [9, 10, 11, 12, 13, 14]  # every round once, on through both changes
  # Without the record of its earlier shapes, a run of another size is refused by its fingerprint.
  assert "incompatible with this config" in out["unrelated"], out["unrelated"]


@pytest.mark.parametrize(
  "overrides, minimum, processes, extra, words",
  [
    (["strategy.name=allreduce", "cluster.num_workers=3"], 0, 3, {}, "--min-workers=0 is invalid; expected the fewest"),
    (["strategy.name=allreduce", "cluster.num_workers=3"], 4, 3, {}, "expected at most -n/--num-processes=3"),
    (["strategy.name=asp", "strategy.options={learning_rate: 0.02}", "cluster.num_workers=3"], 2, 4, {}, "already restart alone"),
    (
      ["strategy.name=hierarchical_allreduce", "strategy.options={group_size: 2}", "cluster.num_workers=4"],
      2, 4, {}, "groups of 2 fix its size",
    ),
    (["strategy.name=allreduce", "cluster.num_workers=3"], 2, 3, {"rejoin_delay": 0.0}, "--rejoin-delay SECONDS"),
  ],
)  # fmt: skip
def test_churn_a_bad_min_workers_is_one_line_before_anything_starts(
  overrides, minimum, processes, extra, words
):
  config = config_lib.load(helpers.QUICKSTART, overrides)
  options = {"max_restarts": 2, "rejoin_delay": 10.0, **extra}
  with pytest.raises(config_lib.ConfigError, match=re.escape(words)):
    commands.check_launch(config, processes, min_workers=minimum, **options)


def test_churn_a_restart_policy_with_min_workers_needs_restarts_and_a_synchronous_run():
  with pytest.raises(ValueError, match="min_workers=0"):
    RestartPolicy(max_restarts=1, run_dir="r", min_workers=0)
  with pytest.raises(ValueError, match="expected it with max_restarts >= 1 and a synchronous run"):
    RestartPolicy(max_restarts=1, run_dir="r", min_workers=2, alone=frozenset({1, 2}))
