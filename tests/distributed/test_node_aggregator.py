"""InHAD's node aggregators between real workers and the parameter server, on ZeroMQ over 127.0.0.1.

The server runs in this process's main thread; each node's aggregator and
each worker's real loop run in threads, as they run in the worker processes
of ``jaxsync launch`` (tests/distributed/test_multiprocess.py runs those).
"""

from __future__ import annotations

import dataclasses
import threading
import time

import jax
import numpy as np
import pytest
import zmq

from jaxsync._src.distributed import node_aggregator, ps_worker, wire
from jaxsync._src.distributed.server import param_server
from jaxsync._src.distributed.server.counters import HostCounters

import helpers


def _experiment(*overrides):
  return helpers.quickstart_experiment(
    "model.name=mlp", "strategy.name=inhad", "run.gradients=40", "run.eval_every=20", *overrides
  )


def _start_nodes(exp, server):
  """Every node's aggregator, started: what the first worker process of each node runs."""
  strategy = exp.strategy
  nodes = [
    node_aggregator.aggregator_for(strategy, w, exp.model.params, server=server.address, token=server.token)
    for w in range(0, strategy.num_workers, strategy.node_size)
  ]
  return [node.start() for node in nodes]


def _start_workers(exp, server, nodes):
  sim, done = exp.simulator(), {}

  def work(worker):
    node = nodes[node_aggregator.node_of(exp.strategy, worker)]
    done[worker] = ps_worker.run_worker(
      exp.strategy, sim.loss_fn, sim.data, exp.model.params, worker=worker, address=node.address,
      token=server.token, reply_timeout=60,
    )  # fmt: skip

  threads = [threading.Thread(target=work, args=(w,), daemon=True) for w in range(exp.strategy.num_workers)]
  for thread in threads:
    thread.start()
  return threads, done


def _assert_the_host_counters_are_the_device_states(server):
  """What the server checks reports against, kept on the host, equals its device state's counters."""
  device = HostCounters.of(server._state)
  for field in dataclasses.fields(HostCounters):
    np.testing.assert_array_equal(
      getattr(server._steps.counters, field.name), getattr(device, field.name), err_msg=field.name
    )


def _serve(exp, server, num_events):
  state = server.init(exp.model.params)
  nodes = _start_nodes(exp, server)
  threads, done = _start_workers(exp, server, nodes)
  state, records = server.advance(state, num_events)
  _assert_the_host_counters_are_the_device_states(server)
  server.stop(timeout=30)
  for thread in threads:
    thread.join(timeout=30)
  for node in nodes:
    node.stop(grace=0.5)
  return state, records, done, nodes


def test_one_node_pulls_every_third_gradient_and_equals_the_simulated_run_bit_for_bit():
  """The gradients stay on the node; the server's rule sees zeros, then the pulled sum: the same mean."""
  exp = _experiment("cluster.num_workers=1", "strategy.options={learning_rate: 0.05, pull_threshold: 3}")
  sim = exp.simulator()
  sim_state, sim_records = sim.advance(sim.init(exp.model.params, 0), 40)
  server = param_server.ParameterServer(exp.strategy, eval_fn=sim.schedule.eval_fn, eval_every=20)
  state, records, done, nodes = _serve(exp, server, 40)
  assert done[0]["pushes"] >= 40
  for a, b in zip(jax.tree.leaves(sim_state.params), jax.tree.leaves(state.params)):
    np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
  np.testing.assert_array_equal(records.loss, np.asarray(sim_records.loss))
  np.testing.assert_array_equal(records.version, np.asarray(sim_records.version))
  np.testing.assert_array_equal(records.released, np.arange(1, 41) % 3 == 0)
  # The server's card: 13 pulled sums and 14 broadcasts (version 0 and each release), not 40 pushes and
  # 40 replies; those stayed inside the node.
  totals = server.totals(state)
  message = server.count * 4
  assert totals.bytes_moved == (13 + 14) * message
  assert totals.bytes_moved_intra == 2 * int(state.event) * message
  assert server._nodes.pulls == 13 and nodes[0].rejected_messages == 0


def test_two_nodes_waiting_for_each_pull_of_k_gradients_equal_bsp():
  """docs/algorithms.md §15's check: wait_for_pull with T = K is bsp at the same momentum, for any node size."""
  options = "{learning_rate: 0.05, momentum: 0.5, local_workers: 1, pull_threshold: 2, wait_for_pull: true}"
  exp = _experiment("cluster.num_workers=2", f"strategy.options={options}")
  bsp = _experiment(
    "cluster.num_workers=2", "strategy.name=bsp", "strategy.options={learning_rate: 0.05, momentum: 0.5}"
  )
  sim = bsp.simulator()
  sim_state, _ = sim.advance(sim.init(bsp.model.params, 0), 10)  # 10 rounds of both workers
  server = param_server.ParameterServer(exp.strategy, idle_timeout=60)
  state, records, done, nodes = _serve(exp, server, 20)
  assert len(nodes) == 2 and int(state.version) == 10 and records.staleness.max() == 0
  for a, b in zip(jax.tree.leaves(sim_state.params), jax.tree.leaves(state.params)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)  # summation order
  # Each pull took one sum from each node.
  assert server._nodes.pulls == 10 and server._nodes.payload_messages == 10 * 2 + 11 * 2


def _dealer(address, identity=None):
  sock = zmq.Context.instance().socket(zmq.DEALER)
  sock.setsockopt(zmq.LINGER, 0)
  if identity is not None:
    sock.setsockopt(zmq.ROUTING_ID, identity)
  sock.connect(address)
  return sock


def test_a_node_sums_only_what_the_server_counts_and_a_worker_cannot_bypass_its_node():
  """A NaN gradient is never summed; a worker's own connection to the server is refused; the pulled mean."""
  exp = _experiment("cluster.num_workers=2", "strategy.options={learning_rate: 0.5, local_workers: 2}")
  server = param_server.ParameterServer(exp.strategy, idle_timeout=60)
  state = server.init(exp.model.params)
  (node,) = _start_nodes(exp, server)
  token, count = server.token, server.count
  workers = [_dealer(node.address) for _ in range(2)]

  def serve(state):  # returns once one arrival is applied (20 s at most)
    return server.advance(state, 1, max_time=server._now() + 20)

  def serve_until_answered(state, socks):  # HELLOs make no arrival: serve until each has its answer
    deadline = time.monotonic() + 20
    while not all(sock.poll(0) for sock in socks) and time.monotonic() < deadline:
      state, _ = server.advance(state, 1, max_time=server._now() + 0.2)
    return state

  def reply(w):
    assert workers[w].poll(5000), f"no answer to worker {w}"
    frames = workers[w].recv_multipart()
    return wire.decode_header(frames[0], token=token), frames[1:]

  def push(w, value, version):
    header = wire.Header(kind=wire.Kind.PUSH, token=token, worker=w, version=version, count=count)
    workers[w].send_multipart(wire.encode(header, np.full(count, value, np.float32)))

  for w in range(2):
    workers[w].send_multipart(wire.encode(wire.Header(kind=wire.Kind.HELLO, token=token, worker=w)))
  state = serve_until_answered(state, workers)
  assert [reply(w)[0].version for w in range(2)] == [0, 0]
  push(0, np.nan, 0)  # the node sees the NaN: reported as such, never summed, the worker answered
  state, records = serve(state)
  assert records.rejected.tolist() == [True] and reply(0)[0].version == 0
  push(0, 1.0, 0)
  state, records = serve(state)
  assert reply(0)[0].version == 0 and node.iteration_number == 1  # kept on the node; the server has zeros
  push(1, 3.0, 0)  # completes the pull: (1 + 3) / 2 = 2, the NaN not among them
  state, records = serve(state)
  header, payload = reply(1)
  assert header.version == 1 and records.released.tolist() == [True]
  before = np.asarray(jax.flatten_util.ravel_pytree(exp.model.params)[0])
  np.testing.assert_allclose(np.frombuffer(payload[0], np.float32), before - 0.5 * 2.0, rtol=1e-6)
  # A version from the future: the server's ERROR names the worker; the node discards the gradient.
  push(0, 7.0, 5)
  state = serve_until_answered(state, workers[:1])
  error = reply(0)[0]
  assert (error.kind, error.reason, node.iteration_number) == (wire.Kind.ERROR, "future_version", 0)
  # A worker that skips its node and dials the server is refused: the server answers only nodes for it.
  rogue = _dealer(server.address)
  rogue.send_multipart(wire.encode(wire.Header(kind=wire.Kind.HELLO, token=token, worker=0)))
  state = serve_until_answered(state, [rogue])
  assert rogue.poll(3000) and wire.decode_header(rogue.recv_multipart()[0], token=token).reason == "worker"
  assert server.rejected_messages["worker"] == 1
  _assert_the_host_counters_are_the_device_states(server)
  server.stop(timeout=1)
  node.stop(grace=1.0)
  assert [reply(w)[0].kind for w in range(2)] == [wire.Kind.STOP, wire.Kind.STOP]  # the node told both
  for sock in [*workers, rogue]:
    sock.close()


def test_inhad_cannot_run_on_a_sharded_server():
  exp = _experiment("cluster.num_workers=2")
  with pytest.raises(ValueError, match=r"num_shards=2.*node aggregators pull from one server"):
    param_server.ParameterServer(exp.strategy, num_shards=2, client=object())
