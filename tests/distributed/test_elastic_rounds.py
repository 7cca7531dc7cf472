"""Elastic DiLoCo on a real parameter server (ZeroMQ over 127.0.0.1, worker loops in threads): churn.

A round averages the pseudo-gradients of the workers that delivered; workers
leave (the server drops them and the rounds go on with the others) and join
(they get the current global parameters and are counted from the round they
join); a deadline closes a round without a straggler, as the simulator's
rounds do with the same deadline.
"""

from __future__ import annotations

import threading
import time

import jax
import numpy as np
import pytest

from jaxsync._src.distributed import ps_worker
from jaxsync._src.distributed.server import param_server

import helpers


def _experiment(*overrides):
  return helpers.quickstart_experiment(
    "model.name=mlp",
    "run.gradients=100000",
    "run.eval_every=4",
    "cluster.jitter_shape=null",
    *overrides,
  )


class _Worker:
  """A real worker loop in a thread; ``leave()`` makes it stop at its next wait for the server."""

  def __init__(self, exp, server, worker: int, *, slowdown: float = 1.0):
    sim = exp.simulator()
    self.leaving, self.result = threading.Event(), {}

    def work():
      self.result.update(
        ps_worker.run_worker(
          exp.strategy,
          sim.loss_fn,
          sim.data,
          exp.model.params,
          worker=worker,
          address=server.address,
          token=server.token,
          reply_timeout=60,
          stop_requested=self.leaving.is_set,
          preemption_grace=0.0,
          slowdown=slowdown,
        )
      )

    self.thread = threading.Thread(target=work, daemon=True)
    self.thread.start()

  def leave(self):
    self.leaving.set()


def _serve(server, state, workers, rounds):
  try:
    state, records = server.advance(state, rounds)
  finally:
    server.stop(timeout=30)
    for w in workers:
      w.thread.join(timeout=30)
  return state, records


def _serve_churning(server, state, churn, workers, *, chunk, field, until, most=4000):
  """Serves chunks of ``chunk`` events while ``churn()`` changes the membership from a thread, until
  ``until(values)`` holds for the records' ``field`` so far (or ``most`` of them); then stops everything.

  Returns:
    ``(state, values)``.
  """
  controller = threading.Thread(target=churn, daemon=True)
  controller.start()
  values = []
  try:
    while len(values) < most and not until(values):
      state, records = server.advance(state, chunk)
      values.extend(np.asarray(getattr(records, field)).tolist())
  finally:
    server.stop(timeout=30)
    for w in workers():
      w.thread.join(timeout=30)
  controller.join(timeout=30)
  return state, values


@pytest.mark.parametrize(
  "name, options",
  [
    ("diloco", "{period: 5, membership: elastic}"),
    # Fragments, an overlapped exchange and mixing: each round's message is one fragment's pseudo-gradient.
    (
      "streaming_diloco",
      "{period: 6, fragments: 2, overlap: 1, mixing: 0.5, quantize: null, membership: elastic}",
    ),
  ],
)
def test_churn_free_elastic_rounds_on_the_server_equal_the_simulated_rounds(name, options):
  """Every worker delivers every round: the server's outer steps are the simulator's, to float rounding."""
  exp = _experiment("cluster.num_workers=2", f"strategy.name={name}", f"strategy.options={options}")
  sim = exp.simulator()
  sim_state, sim_records = sim.advance(sim.init(exp.model.params, 0), 6)
  server = param_server.ParameterServer(
    exp.strategy, eval_fn=sim.schedule.eval_fn, eval_every=4, idle_timeout=60
  )
  state = server.init(exp.model.params)
  workers = [_Worker(exp, server, w) for w in range(2)]
  state, records = _serve(server, state, workers, 6)
  for a, b in zip(jax.tree.leaves(sim_state.params), jax.tree.leaves(state.params)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)
  np.testing.assert_array_equal(records.k, [2] * 6)
  np.testing.assert_array_equal(records.k, np.asarray(sim_records.k))
  np.testing.assert_array_equal(records.evaluated, np.asarray(sim_records.evaluated))
  # Every push stood for a round's local steps (the workers' data steps), none was dropped.
  np.testing.assert_array_equal(state.steps, [6 * exp.strategy.local_steps] * 2)
  assert server.dropped_gradients == 0


def test_churn_a_worker_that_leaves_is_dropped_from_the_rounds_and_one_that_joins_is_counted_again():
  """3 workers; worker 2 leaves after round 3 (the liveness service stops seeing it) and a new worker takes
  its place after round 7: the rounds go on with 2 members, then 3; nothing is applied twice."""
  exp = _experiment(
    "cluster.num_workers=3", "strategy.name=diloco", "strategy.options={period: 4, membership: elastic}"
  )
  live = {0, 1, 2}
  server = param_server.ParameterServer(exp.strategy, liveness=lambda: set(live), idle_timeout=60)
  state = server.init(exp.model.params)
  workers = [_Worker(exp, server, w) for w in range(3)]
  joined: list[_Worker] = []

  def churn():
    counters = lambda: server._steps.counters if server._steps else None  # noqa: E731
    while counters() is None or counters().event < 3:
      time.sleep(0.01)
    workers[2].leave()
    live.discard(2)
    while counters().event < 7:
      time.sleep(0.01)
    live.add(2)
    joined.append(_Worker(exp, server, 2))  # compiles, then says HELLO: the rounds go on meanwhile

  state, k = _serve_churning(
    server,
    state,
    churn,
    lambda: [*workers, *joined],
    chunk=4,
    field="k",
    until=lambda k: joined and k[-1] == 3,
  )
  assert k[:3] == [3, 3, 3], k
  left = k.index(2)
  assert left >= 3 and k[-1] == 3 and set(k[left : k.index(3, left)]) == {2}, k
  assert [x["worker"] for x in server.lost] == [2]
  # Nothing applied twice: the rounds' members add up to the pushes the server accepted.
  h = exp.strategy.local_steps
  assert sum(k) == int(np.asarray(state.used).sum()) // h
  pushes = sum(w.result["pushes"] for w in [*workers, *joined])
  assert sum(k) + server.dropped_gradients <= pushes <= sum(k) + server.dropped_gradients + 4
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state.params))


def test_churn_a_round_below_its_quorum_waits_for_a_replacement():
  """quorum 3 of 3: when worker 2 leaves, the open round cannot close with 2 pseudo-gradients; it waits
  (no outer step) until a replacement joins it, and every round has 3 members."""
  exp = _experiment(
    "cluster.num_workers=3",
    "strategy.name=diloco",
    "strategy.options={period: 4, membership: elastic, quorum: 3}",
  )
  live = {0, 1, 2}
  server = param_server.ParameterServer(exp.strategy, liveness=lambda: set(live), idle_timeout=60)
  state = server.init(exp.model.params)
  workers = [_Worker(exp, server, w) for w in range(3)]
  joined, stalled = [], {}

  def churn():
    counters = lambda: server._steps.counters if server._steps else None  # noqa: E731
    while counters() is None or counters().event < 3:
      time.sleep(0.01)
    workers[2].leave()
    live.discard(2)
    while counters().live[2]:
      time.sleep(0.01)
    stalled["at"] = counters().event
    time.sleep(1.0)  # no round closes meanwhile
    stalled["after"] = counters().event
    live.add(2)
    joined.append(_Worker(exp, server, 2))

  controller = threading.Thread(target=churn, daemon=True)
  controller.start()
  try:
    state, records = server.advance(state, 10)
  finally:
    server.stop(timeout=30)
    for w in [*workers, *joined]:
      w.thread.join(timeout=30)
  controller.join(timeout=30)
  assert stalled["after"] == stalled["at"], stalled
  np.testing.assert_array_equal(records.k, [3] * 10)
  assert [x["worker"] for x in server.lost] == [2]


def test_churn_a_worker_restarted_after_it_delivered_is_not_counted_twice_in_that_round():
  """Worker 0 delivers its pseudo-gradient of a round that waits for a slow worker 2, and its process is
  replaced before anyone notices it gone: the replacement waits for the next round (its predecessor's
  pseudo-gradient stands), so no round counts more than 3."""
  exp = _experiment(
    "cluster.num_workers=3", "strategy.name=diloco", "strategy.options={period: 4, membership: elastic}"
  )
  server = param_server.ParameterServer(exp.strategy, idle_timeout=60)
  state = server.init(exp.model.params)
  workers = [_Worker(exp, server, w, slowdown=150.0 if w == 2 else 1.0) for w in range(3)]
  replaced = []

  def replace_worker_0():
    counters = lambda: server._steps.counters if server._steps else None  # noqa: E731
    while counters() is None or counters().event < 1 or not counters().waiting[0] or counters().waiting[2]:
      time.sleep(0.002)
    workers[0].leave()
    replaced.append(_Worker(exp, server, 0))

  controller = threading.Thread(target=replace_worker_0, daemon=True)
  controller.start()
  try:
    state, records = server.advance(state, 3)  # worker 2 takes seconds a round
  finally:
    server.stop(timeout=30)
    for w in [*workers, *replaced]:
      w.thread.join(timeout=30)
  controller.join(timeout=30)
  np.testing.assert_array_equal(records.k, [3] * 3)
  assert replaced and replaced[0].result["pushes"] >= 1


def test_churn_asynchronous_local_sgd_goes_on_without_a_worker_that_left_and_takes_in_its_replacement():
  """Asynchronous local SGD's server applies each pushed pseudo-gradient as it comes: worker 2 leaves after
  10 arrivals (its round in progress is never pushed), a replacement joins after 30 with the current
  parameters, and its pushes are applied again."""
  exp = _experiment("cluster.num_workers=3", "strategy.name=async_local_sgd", "strategy.options={period: 4}")
  live = {0, 1, 2}
  server = param_server.ParameterServer(exp.strategy, liveness=lambda: set(live), idle_timeout=60)
  state = server.init(exp.model.params)
  workers = [_Worker(exp, server, w) for w in range(3)]
  joined: list[_Worker] = []
  marks = {}

  def churn():
    counters = lambda: server._steps.counters if server._steps else None  # noqa: E731
    while counters() is None or counters().event < 10:
      time.sleep(0.005)
    workers[2].leave()
    live.discard(2)
    while counters().event < 30 or counters().live[2]:
      time.sleep(0.005)
    marks["left"] = counters().event  # the server has dropped it
    live.add(2)
    joined.append(_Worker(exp, server, 2))

  state, senders = _serve_churning(
    server, state, churn, lambda: [*workers, *joined], chunk=10, field="worker",
    until=lambda senders: joined and senders[marks["left"] :].count(2) >= 3,
  )  # fmt: skip
  gone = senders[marks["left"] :]
  back = gone.index(2)  # the replacement's first push
  assert back > 0 and 2 not in gone[:back] and {0, 1} <= set(gone[:back]), senders
  assert [x["worker"] for x in server.lost] == [2]
  # Every applied pseudo-gradient is one push; the one worker 2 may have sent after it was dropped is
  # counted as dropped, never applied.
  pushes = sum(w.result["pushes"] for w in [*workers, *joined])
  assert len(senders) + server.dropped_gradients <= pushes <= len(senders) + server.dropped_gradients + 4


def test_churn_a_deadline_closes_rounds_without_a_slow_worker_as_the_simulator_does():
  """Worker 2 is 100x slower; a round closes 0.1 s after its first pseudo-gradient. The simulator (each
  step 4 ms, 10 steps a round) keeps workers 0 and 1 in every round; so does the server (its workers' round
  takes a few milliseconds, worker 2's hundreds), once every worker has compiled its round (round 0's
  members depend on who compiled first)."""
  overrides = (
    "cluster.num_workers=3",
    "cluster.slow_fraction=0.3",  # round(0.9) = 1 slow worker: worker 2
    "cluster.slowdown=100",
    "cluster.compute_time=0.004",
    "strategy.name=diloco",
    "strategy.options={period: 10, membership: elastic, quorum: 2, deadline: 0.1}",
  )
  exp = _experiment(*overrides)
  sim = exp.simulator()
  _, sim_records = sim.advance(sim.init(exp.model.params, 0), 8)
  np.testing.assert_array_equal(np.asarray(sim_records.k), [2] * 8)
  server = param_server.ParameterServer(exp.strategy, idle_timeout=60)
  state = server.init(exp.model.params)
  workers = [_Worker(exp, server, w, slowdown=100.0 if w == 2 else 1.0) for w in range(3)]
  k = []
  try:
    # Rounds of 10 until worker 2's first late pseudo-gradient comes (its round takes 100x a few ms).
    while server.dropped_gradients == 0 and len(k) < 400:
      state, records = server.advance(state, 10)
      k.extend(np.asarray(records.k).tolist())
  finally:
    server.stop(timeout=30)
    for w in workers:
      w.thread.join(timeout=30)
  assert k[2:] == [2] * (len(k) - 2), k
  assert server.dropped_gradients >= 1  # worker 2's late pseudo-gradients, counted and never applied
  assert int(np.asarray(state.used)[2]) <= exp.strategy.local_steps  # at most round 0's


@pytest.mark.parametrize(
  "options, message",
  [
    ("{membership: elastic, quorum: 4}", "quorum=4 is invalid; expected an integer in [1, num_workers=3]"),
    ("{membership: elastic, quorum: 0}", "quorum=0 is invalid"),
    (
      "{membership: elastic, deadline: 0}",
      "deadline=0.0 is invalid; expected a finite real number in (0.0, inf]",
    ),
    ("{membership: elastic, deadline: soon}", "deadline='soon' is invalid"),
    ("{quorum: 2}", "quorum=2 is invalid; expected null unless membership='elastic'"),
    ("{membership: elastc}", "did you mean 'elastic'"),
  ],
)
def test_churn_options_that_cannot_work_are_rejected_before_anything_starts(options, message):
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
    _experiment("cluster.num_workers=3", "strategy.name=diloco", f"strategy.options={options}")
