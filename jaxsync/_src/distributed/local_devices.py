r"""A worker process with several devices: its batch data-parallel across them, one gradient out.

A GPU node has 8 devices, a TPU host 4 chips; a parameter-server worker that
owns them computes its batch split across them in one jitted step and pushes
one gradient, synchronous inside the node and asynchronous across nodes:

.. math::

  g = \frac{1}{D} \sum_{d=1}^{D} \nabla L(\theta; \text{batch}_d), \qquad
  \text{batch} = \text{batch}_1 \cup \dots \cup \text{batch}_D

(a ``psum`` over the process's own devices, inside a ``shard_map``). For a
loss that is a mean over the batch, ``g`` is the gradient of the whole batch,
to float rounding: the run is the one-device run, faster.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from jaxsync._src.core import validation
from jaxsync._src.rules import guard
from jaxsync._src.steps.arrival import WorkerGradient, worker_gradient

AXIS = "local_devices"
_WHAT = "local_devices"


def check_batch(batch_size: int, num_devices: int, group_size: int = 1) -> int:
  """``batch_size``, checked so that the process's batch splits evenly over ``num_devices`` devices.

  The process's batch is ``group_size`` workers' batches (an EA-wild group's
  members'), ``batch_size`` each. Raises ValueError.
  """
  if (group_size * batch_size) % num_devices:
    whole = "" if group_size == 1 else f" (times the group's {group_size} workers)"
    raise validation.invalid(
      _WHAT,
      "data.batch_size",
      batch_size,
      f"a size whose process batch{whole} splits over this worker process's {num_devices} local "
      "devices (each computes an equal share)",
    )
  return batch_size


def gradient_fn(loss_fn, devices: Sequence[Any] | None = None) -> Callable[[Any, Any], WorkerGradient]:
  """``(point, batch) -> WorkerGradient``: on one device as the simulator, or data-parallel over ``devices``.

  Args:
    loss_fn: ``(params, batch) -> scalar``, a mean over the batch.
    devices: this process's devices (default ``jax.local_devices()``); one
      device gives :func:`arrival.worker_gradient` itself.

  Returns:
    A function to call inside ``jit``: the loss and the gradient averaged over
    the devices' shares of the batch (split along its first axis), and
    whether the gradient is finite.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> grad = gradient_fn(lambda p, b: jnp.mean((p * b) ** 2))
    >>> got = jax.jit(grad)(jnp.float32(2.0), jnp.arange(4.0))
    >>> float(got.grads)  # 2 p mean(b^2) = 4 * 3.5
    14.0
  """
  devices = list(jax.local_devices() if devices is None else devices)
  if len(devices) == 1:
    return lambda point, batch: worker_gradient(loss_fn, point, batch)
  mesh = Mesh(np.array(devices), (AXIS,))

  def shard(point, batch):
    loss, grads = jax.value_and_grad(loss_fn)(point, batch)
    return jax.lax.pmean(loss, AXIS), jax.lax.pmean(grads, AXIS)

  def gradient(point, batch) -> WorkerGradient:
    split = jax.shard_map(shard, mesh=mesh, in_specs=(P(), P(AXIS)), out_specs=(P(), P()), check_vma=False)
    loss, grads = split(point, batch)
    return WorkerGradient(jnp.asarray(loss, jnp.float32), grads, guard.tree_all_finite(grads))

  return gradient
