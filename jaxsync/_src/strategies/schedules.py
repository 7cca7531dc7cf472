"""The papers' learning-rate schedules as one optax schedule: linear warm-up, then constant, step or cosine.

The schedule's step is the strategy's :class:`RateClock` (server updates, or a
worker's own steps); convert epochs to that clock with
:func:`steps_per_epoch`.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
import optax

from jaxsync._src.core import validation
from jaxsync._src.strategies.strategy import Blueprint, RateClock

KINDS = ("constant", "step", "cosine")
_WHAT = "learning_rate_schedule"


def learning_rate_schedule(
  peak: float,
  *,
  kind: str = "constant",
  warmup_steps: float = 0.0,
  warmup_from: float = 0.0,
  boundaries: Sequence[float] = (),
  decay: float = 0.1,
  decay_steps: float | None = None,
  end: float = 0.0,
) -> optax.Schedule:
  r"""A warm-up and a decay, as the papers train: ``step -> rate``.

  .. math::

    \eta(t) = \begin{cases}
      \eta\,(f + (1 - f)\, t / W) & t < W \text{ (linear warm-up from } f\eta) \\
      \eta & \text{constant} \\
      \eta\, d^{\,|\{b_i \le t\}|} & \text{step: times } d \text{ at each boundary } b_i \\
      \eta\,\big(e + (1 - e)\,\tfrac12 (1 + \cos(\pi \min(t - W, D) / D))\big) & \text{cosine over } D
    \end{cases}

  Boundaries count from step 0 (a warm-up does not shift them), the cosine
  from the warm-up's end. E.g. SMEGA²'s trainer: warm-up over 5 epochs from
  ``eta / N``, then ``x0.1`` at epochs 80 and 120.

  Args:
    peak: ``eta``, the rate after the warm-up, ``> 0``.
    kind: ``"constant"``, ``"step"`` or ``"cosine"``.
    warmup_steps: ``W >= 0``.
    warmup_from: ``f`` in ``[0, 1]``, the warm-up's first rate as a fraction of ``eta``.
    boundaries: step decay's ``b_i``, increasing (``kind="step"``).
    decay: ``d`` in ``(0, 1]``, the factor at each boundary.
    decay_steps: ``D > 0``, the cosine's length (``kind="cosine"``).
    end: ``e`` in ``[0, 1]``, the cosine's final rate as a fraction of ``eta``.

  Returns:
    An optax schedule (a function of the step count).

  Example:
    >>> from jaxsync._src.strategies.schedules import learning_rate_schedule
    >>> s = learning_rate_schedule(0.1, kind="step", warmup_steps=5, warmup_from=0.25, boundaries=[10, 20])
    >>> [round(float(s(t)), 4) for t in (0, 5, 9, 10, 25)]
    [0.025, 0.1, 0.1, 0.01, 0.001]

  References:
    Goyal et al., "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour",
    2017 (linear warm-up, linear scaling); Loshchilov, Hutter, "SGDR", ICLR 2017 (cosine).
  """
  peak = validation.check_real(_WHAT, "peak", peak, low=0.0, low_open=True)
  kind = validation.check_choice(_WHAT, "kind", kind, KINDS)
  warmup = validation.check_real(_WHAT, "warmup_steps", warmup_steps, low=0.0)
  start = validation.check_real(_WHAT, "warmup_from", warmup_from, low=0.0, high=1.0)
  decay = validation.check_real(_WHAT, "decay", decay, low=0.0, high=1.0, low_open=True)
  end = validation.check_real(_WHAT, "end", end, low=0.0, high=1.0)
  points = [validation.check_real(_WHAT, "boundaries[i]", b, low=0.0) for b in boundaries]
  if points != sorted(points):
    raise validation.invalid(_WHAT, "boundaries", list(boundaries), "increasing steps")
  if kind != "step" and points:
    raise validation.invalid(_WHAT, "boundaries", list(boundaries), f"none with kind={kind!r}")
  if kind == "cosine":
    if decay_steps is None:
      raise validation.invalid(
        _WHAT, "decay_steps", decay_steps, "the cosine's length (> 0) with kind='cosine'"
      )
    length = validation.check_real(_WHAT, "decay_steps", decay_steps, low=0.0, low_open=True)

  def schedule(step):
    t = jnp.asarray(step, jnp.float32)
    if kind == "step":
      rate = peak * jnp.asarray(decay, jnp.float32) ** sum((t >= b).astype(jnp.float32) for b in points)
    elif kind == "cosine":
      progress = jnp.clip((t - warmup) / length, 0.0, 1.0)
      rate = peak * (end + (1.0 - end) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress)))
    else:
      rate = jnp.asarray(peak, jnp.float32)
    if warmup > 0:
      ramp = peak * (start + (1.0 - start) * t / warmup)
      rate = jnp.where(t < warmup, ramp, rate)
    return rate

  return schedule


def steps_per_epoch(strategy: Blueprint, *, num_examples: int, batch_size: int) -> float:
  """How many steps of ``strategy``'s rate clock one pass over ``num_examples`` takes.

  An epoch is ``num_examples / batch_size`` worker gradients: on the server
  updates' clock that is ``/ gradients_per_update`` updates, on the workers'
  clock ``/ K`` steps of each worker.

  Raises:
    ValueError: for a strategy whose updates combine a varying number of
      gradients (adaptive-k): its epochs have no fixed number of updates.
  """
  gradients = num_examples / batch_size
  if strategy.rate_clock == RateClock.WORKER_STEPS:
    return gradients / strategy.num_workers
  if strategy.gradients_per_update is None:
    raise validation.invalid(
      strategy.name,
      "schedule unit",
      "epochs",
      f"'updates': {strategy.name}'s updates combine a varying number of gradients, so an epoch has no "
      "fixed number of them",
    )
  return gradients / strategy.gradients_per_update
