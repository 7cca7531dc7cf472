"""Small utilities shared by the tests: arrival traces, jitted updates, quadratic losses, configs, histories."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax

# The shipped configs, found from the repository root: the suite passes when run from any directory.
ROOT = pathlib.Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"


def jaxsync_process(*args: str, cwd=None):
  """``python -m jaxsync.cli ARGS --progress quiet`` started in ``cwd`` (default: here), its output piped (stdout
  and stderr together, as text), a 3 s heartbeat timeout: how the multi-process tests run jaxsync."""
  import os
  import subprocess
  import sys

  env = {**os.environ, "PYTHONUNBUFFERED": "1", "JAXSYNC_HEARTBEAT_TIMEOUT": "3"}
  return subprocess.Popen(
    [sys.executable, "-m", "jaxsync.cli", *args, "--progress", "quiet"],
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    env=env,
    cwd=cwd or os.getcwd(),
  )


def quickstart_experiment(*overrides: str):
  """``configs/quickstart.yaml`` with the dotted ``overrides`` (as ``--set`` takes them), built."""
  from jaxsync._src.app import config as config_lib
  from jaxsync._src.app import experiment

  return experiment.build(config_lib.load(QUICKSTART, list(overrides)))


def asgd_trace(worker_choices, num_workers):
  """An asynchronous-scheduler arrival trace: who arrives at each t, with which version.

  All workers start on version 0; the worker that arrives at ``t`` is sent the
  parameters of version ``t + 1`` (OrMo Alg. 1, Option II).
  """
  versions = [0] * num_workers
  trace = []
  for t, worker in enumerate(worker_choices):
    trace.append((worker, versions[worker]))
    versions[worker] = t + 1
  return trace


def jit_update(tx):
  """``tx.update`` under ``jax.jit``; extra args are passed as traced arrays."""

  @jax.jit
  def update(grads, state, params, extra):
    return tx.update(grads, state, params, **extra)

  return update


def quadratic(curvatures):
  """``f(x) = 0.5 sum_i a_i x_i^2`` and its gradient, for a 1-D parameter vector."""
  a = jnp.asarray(curvatures, jnp.float32)

  def loss(x):
    return 0.5 * jnp.sum(a * x * x)

  return loss, jax.grad(loss)


def rosenbrock(x):
  """The 2-D Rosenbrock function, minimum 0 at (1, 1)."""
  return (1.0 - x[0]) ** 2 + 100.0 * (x[1] - x[0] ** 2) ** 2


def assert_trees_close(a, b, rtol=1e-5, atol=1e-6):
  jax.tree.map(
    lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol),
    a,
    b,
  )


def assert_state_unchanged_but(old, new, *fields):
  """Every field of a NamedTuple state is identical except the named ones."""
  for name in old._fields:
    if name in fields:
      continue
    jax.tree.map(
      lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)),
      getattr(old, name),
      getattr(new, name),
    )


def apply(params, updates):
  return optax.apply_updates(params, updates)


def sync_state_like(exp, num_workers: int):
  """A ``SyncState`` with ``exp``'s structure: what a synchronous run's checkpoint is restored into."""
  from jaxsync._src.distributed import sync_runtime

  return sync_runtime.SyncState(
    clock=np.float32(0),
    params=exp.model.params,
    rule_state=exp.strategy.server_rule.init(exp.model.params),
    version=np.int32(0),
    steps=np.zeros([num_workers], np.int32),
    worker_params=(),
    worker_state=(),
    next_eval=np.float32(0),
    event=np.int32(0),
  )


def made_up_history(events: int, eval_metrics: dict, metrics_dtype=np.float32, **fields):
  """A History of ``events`` events, made up: one a second from t = 1, worker 0, fresh, each one update,
  released, loss 1; the evaluations ``eval_metrics`` (as ``metrics_dtype``) every 10 s from t = 0; any field given in ``fields``.

  ``rejected_count`` follows ``rejected``; ``worker_steps`` and ``worker_used`` count every event on one worker.
  """
  from jaxsync._src.interface.history import History

  evaluations = len(fields["eval_time"]) if "eval_time" in fields else len(next(iter(eval_metrics.values())))
  zeros = np.zeros(events, np.int32)
  values = dict(
    time=np.arange(1, events + 1, dtype=np.float32),
    worker=zeros,
    staleness=zeros,
    version=np.arange(1, events + 1, dtype=np.int32),
    released=np.ones(events, bool),
    k=np.ones(events, np.int32),
    loss=np.ones(events, np.float32),
    rejected=np.zeros(events, bool),
    step_size=np.full(events, np.nan, np.float32),
    eval_time=np.arange(evaluations, dtype=np.float32) * 10,
    eval_version=np.arange(evaluations, dtype=np.int32),
    eval_event=np.arange(evaluations, dtype=np.int32),
    worker_steps=np.array([events]),
    worker_used=np.array([events]),
    worker_idle=np.zeros(1),
    bytes_moved=0.0,
    bytes_moved_intra=0.0,
  )
  values.update(fields)
  values.setdefault("rejected_count", int(np.sum(values["rejected"])))
  metrics = {name: np.asarray(v, metrics_dtype) for name, v in eval_metrics.items()}
  return History(eval_metrics=metrics, **values)
