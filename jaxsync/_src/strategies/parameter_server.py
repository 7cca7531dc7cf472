"""Asynchronous strategies with a parameter server: each arrival applied (or buffered) on its own.

ASP and Hogwild, the momentum rules for stale gradients (naive server
momentum, shifted momentum, SMEGA², OrMo and OrMo-DA), DC-ASGD's delay
compensation, the bounded-staleness dispatches (SSP, K-async, n-softsync) and
adaptive-k release with progressive momentum and per-worker Barzilai-Borwein
step sizes (Zhang, Ji, Wang, JPDC 2022).
"""

from __future__ import annotations

import functools

import optax

from jaxsync._src.core import validation
from jaxsync._src.rules import barzilai_borwein
from jaxsync._src.rules.adaptive_k import adaptive_k as adaptive_k_rule
from jaxsync._src.rules.delay_compensation import dc_asgd as dc_asgd_rule
from jaxsync._src.rules.ordered_momentum import ordered_momentum
from jaxsync._src.rules.release import on_release
from jaxsync._src.rules.smega2 import smega2 as smega2_rule
from jaxsync._src.rules.staleness import scale_by_staleness
from jaxsync._src.strategies import pieces
from jaxsync._src.strategies.strategy import (
  Communication,
  Dispatch,
  RateClock,
  ServerTraffic,
  reject_nonfinite,
)
from jaxsync._src.strategies.table import Recipe, register

_SMEGA2_MEANINGS = {
  "dampening": "the momentum's dampening, in [0, 1)",
  "look_ahead": "the parameters the server replies with: advanced (the look-ahead point) or current",
}
_ORMO_DA_MEANINGS = {"delay_measure": "how OrMo-DA measures a gradient's delay: iterations or groups"}
_DC_ASGD_MEANINGS = {
  "variance_control": "lambda_0, the weight of the delay compensation g*g*(w - w_pulled) (0: plain ASGD;"
  " default the paper's: 0.04, or 2 with adaptive)",
  "adaptive": "DC-ASGD-a: lambda_0 divided by the root of the running mean of g*g",
  "mean_square_decay": "the decay of DC-ASGD-a's running mean of g*g, in [0, 1)",
}
_SSP_MEANINGS = {"staleness_bound": "how many clocks the fastest worker may run ahead of the slowest"}
_K_ASYNC_MEANINGS = {"k": "arrivals per update, stale or not (default K/2)"}
_STALENESS_MEANINGS = {
  "mode": "how staleness scales the rate: linear (1/staleness) or exponential (penalty^staleness)",
  "penalty": "the base of the exponential penalty (mode=exponential)",
  "gradients_per_update": "arrivals summed per update (n-softsync's K/n)",
}
_ADAPTIVE_K_MEANINGS = {
  "theta": "how much gradient noise a release tolerates, in (0, 1]: smaller waits for more gradients",
  "confidence": "the confidence level of the t-interval test that decides a release, in (0, 1)",
  "ci_endpoint": "which end of the confidence interval the test reads: upper (the paper) or lower (stricter)",
  "max_k": "the most gradients one release waits for (default: every live worker)",
  "fresh_staleness": "how many steps old a gradient may be and still count toward k and wait for the"
  " release: 0 (the current step), 1, ..., or null (every arrival)",
  "bb_step_size": "per-worker Barzilai-Borwein step sizes (workers scale their own gradients)",
  "bb_smoothing": "smoothing of the Barzilai-Borwein step sizes between steps, in (0, 1]",
  "bb_max_scale": "the largest Barzilai-Borwein step size, as a multiple of learning_rate",
  "armijo": "Armijo backtracking on each worker's Barzilai-Borwein step (needs bb_step_size)",
}


@register("asp", learning_rate=0.01)
def _asp(num_workers, *, weight_decay=0.0, server_optimizer="sgd") -> Recipe:
  """Asynchronous SGD through a parameter server: apply each arrival, reply at once (Dean et al., NeurIPS 2012).

  ``server_optimizer`` is what the server applies per arrival: ``"sgd"``, or
  ``"adam"`` / ``"rmsprop"``, the optimizers whose memory traffic the
  adaptive-k paper (JPDC 2022, §3.6) names as the server's bottleneck.
  """
  name = "asp"
  optimizer, traffic = pieces.server_optimizer(name, server_optimizer)
  decay = pieces.check_decay(name, weight_decay)
  blueprint = pieces.asynchronous(name, num_workers, server_traffic=ServerTraffic(0.0, traffic))
  return Recipe(blueprint, lambda lr: (pieces.decayed(optimizer(lr), decay), None))


@register("hogwild", learning_rate=0.01)
def _hogwild(num_workers, *, weight_decay=0.0) -> Recipe:
  """Hogwild: ASGD on shared memory, lock-free, no network cost (Niu et al. 2011)."""
  name = "hogwild"
  decay = pieces.check_decay(name, weight_decay)
  blueprint = pieces.asynchronous(name, num_workers, communication=Communication.SHARED_MEMORY)
  return Recipe(blueprint, lambda lr: (pieces.decayed(pieces.sgd(lr), decay), None))


@register("naive_asgdm", learning_rate=0.1)
def _naive_asgdm(num_workers, *, momentum=0.9, weight_decay=0.0) -> Recipe:
  """ASGD with server momentum applied straight to stale gradients (the OrMo paper's baseline, NeurIPS 2024)."""
  name = "naive_asgdm"
  momentum = pieces.check_momentum(name, momentum)
  decay = pieces.check_decay(name, weight_decay)
  blueprint = pieces.asynchronous(
    name, num_workers, server_traffic=ServerTraffic(0.0, pieces.sgd_traffic(momentum))
  )
  return Recipe(blueprint, lambda lr: (pieces.decayed(pieces.sgd(lr, momentum), decay), None))


@register("shifted_momentum", learning_rate=0.1)
def _shifted_momentum(num_workers, *, momentum=0.9, weight_decay=0.0) -> Recipe:
  """Shifted momentum: each worker keeps a local momentum and sends it (Giladi et al., ICLR 2020)."""
  name = "shifted_momentum"
  momentum = pieces.check_momentum(name, momentum)
  decay = pieces.check_decay(name, weight_decay)
  return Recipe(
    pieces.asynchronous(name, num_workers),
    lambda lr: (pieces.decayed(pieces.sgd(lr), decay), reject_nonfinite(optax.trace(decay=momentum))),
  )


@register("smega2", learning_rate=0.1, meanings=_SMEGA2_MEANINGS)
def _smega2(num_workers, *, momentum=0.9, dampening=0.0, look_ahead="advanced", weight_decay=0.0) -> Recipe:
  """SMEGA²: one shared momentum updated per cycle of K arrivals, look-ahead replies (Cohen et al., ICPP 2022)."""
  decay = pieces.check_decay("smega2", weight_decay)
  # The update (gradient, cycle sum, momentum, parameters: 7 arrays) and the look-ahead reply (4).
  blueprint = pieces.asynchronous("smega2", num_workers, server_traffic=ServerTraffic(0.0, 11.0))
  return Recipe(
    blueprint,
    lambda lr: (
      pieces.decayed(
        smega2_rule(lr, momentum, num_workers=num_workers, dampening=dampening, look_ahead=look_ahead), decay
      ),
      None,
    ),
  )


@register("ormo", learning_rate=0.1)
def _ormo(num_workers, *, momentum=0.9, weight_decay=0.0) -> Recipe:
  """OrMo: ordered momentum, stale gradients placed by their iteration group (Shi et al., NeurIPS 2024)."""
  decay = pieces.check_decay("ormo", weight_decay)
  blueprint = pieces.asynchronous(
    "ormo", num_workers, server_traffic=ServerTraffic(0.0, pieces.MOMENTUM_TRAFFIC)
  )
  return Recipe(
    blueprint,
    lambda lr: (pieces.decayed(ordered_momentum(lr, momentum, num_workers=num_workers), decay), None),
  )


@register("ormo_da", learning_rate=0.1, meanings=_ORMO_DA_MEANINGS)
def _ormo_da(num_workers, *, momentum=0.9, delay_measure="iterations", weight_decay=0.0) -> Recipe:
  """OrMo-DA: OrMo with a delay-adaptive learning rate (Shi et al., NeurIPS 2024)."""
  decay = pieces.check_decay("ormo_da", weight_decay)
  blueprint = pieces.asynchronous(
    "ormo_da", num_workers, server_traffic=ServerTraffic(0.0, pieces.MOMENTUM_TRAFFIC)
  )

  def rules(lr):
    rule = ordered_momentum(
      lr, momentum, num_workers=num_workers, delay_adaptive=True, delay_measure=delay_measure
    )
    return pieces.decayed(rule, decay), None

  return Recipe(blueprint, rules)


@register("dc_asgd", learning_rate=0.01, meanings=_DC_ASGD_MEANINGS)
def _dc_asgd(
  num_workers, *, variance_control=None, adaptive=False, mean_square_decay=0.95, weight_decay=0.0
) -> Recipe:
  """DC-ASGD: asynchronous SGD whose server compensates each stale gradient to first order (Zheng et al., ICML 2017)."""
  name = "dc_asgd"
  decay = pieces.check_decay(name, weight_decay)
  rule = functools.partial(
    dc_asgd_rule,
    variance_control=variance_control,
    num_workers=num_workers,
    adaptive=adaptive,
    mean_square_decay=mean_square_decay,
  )
  rule(0.01)  # checks the options now, before a learning rate is known
  # Read g, w and the sender's backup, write w and the backup (5); MeanSquare read and written (7).
  traffic = pieces.ADAM_TRAFFIC if adaptive else pieces.MOMENTUM_TRAFFIC
  blueprint = pieces.asynchronous(name, num_workers, server_traffic=ServerTraffic(0.0, traffic))
  return Recipe(blueprint, lambda lr: (pieces.decayed(rule(lr), decay), None))


@register("ssp", learning_rate=0.01, meanings=_SSP_MEANINGS)
def _ssp(num_workers, *, momentum=0.0, staleness_bound=3, weight_decay=0.0) -> Recipe:
  """Stale synchronous parallel: no worker runs more than ``staleness_bound`` clocks ahead (Ho et al., NeurIPS 2013)."""
  name = "ssp"
  bound = validation.check_int(name, "staleness_bound", staleness_bound, low=0)
  momentum = pieces.check_momentum(name, momentum)
  decay = pieces.check_decay(name, weight_decay)
  blueprint = pieces.asynchronous(
    name,
    num_workers,
    dispatch=Dispatch.SSP,
    staleness_bound=bound,
    server_traffic=ServerTraffic(0.0, pieces.sgd_traffic(momentum)),
  )
  return Recipe(blueprint, lambda lr: (pieces.decayed(pieces.sgd(lr, momentum), decay), None))


@register("k_async", learning_rate=0.01, meanings=_K_ASYNC_MEANINGS)
def _k_async(num_workers, *, momentum=0.0, k=None, weight_decay=0.0) -> Recipe:
  """K-async SGD: update on any k arrivals (stale or not), reply to those k (Dutta et al., AISTATS 2018)."""
  name = "k_async"
  k = validation.check_int(name, "k", max(1, num_workers // 2) if k is None else k)
  if k > num_workers:
    raise validation.invalid(name, "k", k, f"an integer in [1, num_workers={num_workers}]")
  momentum = pieces.check_momentum(name, momentum)
  decay = pieces.check_decay(name, weight_decay)
  blueprint = pieces.asynchronous(
    name,
    num_workers,
    dispatch=Dispatch.ON_RELEASE,
    gradients_per_update=float(k),
    server_traffic=ServerTraffic(pieces.ACCUMULATE_TRAFFIC, pieces.sgd_traffic(momentum)),
  )
  return Recipe(blueprint, lambda lr: (pieces.decayed(pieces.buffered_sgd(k, lr, momentum), decay), None))


@register("staleness_aware_asp", learning_rate=0.01, meanings=_STALENESS_MEANINGS)
def _staleness_aware_asp(
  num_workers, *, mode="linear", penalty=None, gradients_per_update=1, weight_decay=0.0
) -> Recipe:
  """ASGD with a learning rate divided by staleness (or its exponential penalty), n-softsync (Zhang et al., IJCAI 2016)."""
  name = "staleness_aware_asp"
  # Made here, not with the rate: it checks mode, penalty and gradients_per_update.
  buffer = scale_by_staleness(mode, penalty=penalty, gradients_per_update=gradients_per_update)
  decay = pieces.check_decay(name, weight_decay)
  per_update = int(gradients_per_update)
  blueprint = pieces.asynchronous(
    name,
    num_workers,
    gradients_per_update=float(per_update),
    server_traffic=ServerTraffic(pieces.ACCUMULATE_TRAFFIC if per_update > 1 else 0.0, pieces.SGD_TRAFFIC),
  )
  # on_release: the rate (and its schedule) steps once per update, not per buffered arrival.
  return Recipe(
    blueprint, lambda lr: (pieces.decayed(on_release(buffer, optax.scale_by_learning_rate(lr)), decay), None)
  )


@register("adaptive_k", learning_rate=0.01, meanings=_ADAPTIVE_K_MEANINGS)
def _adaptive_k(
  num_workers,
  *,
  momentum=0.9,
  theta=1.0,
  confidence=0.95,
  ci_endpoint="upper",
  max_k=None,
  fresh_staleness=0,
  bb_step_size=False,
  bb_smoothing=0.1,
  bb_max_scale=barzilai_borwein.DEFAULT_MAX_SCALE,
  armijo=False,
  weight_decay=0.0,
  server_optimizer="sgd",
) -> Recipe:
  """Adaptive-k release, progressive momentum, optional per-worker BB step sizes (Zhang, Ji, Wang, JPDC 2022).

  ``bb_max_scale`` (jaxsync's safeguard, not the paper's) bounds each worker's BB
  step to ``[learning_rate / bb_max_scale, learning_rate * bb_max_scale]``;
  ``None`` is the paper's unbounded rule (see :func:`jaxsync.bb_step_size`).
  ``server_optimizer="adam"`` (or ``"rmsprop"``) applies that optimizer to
  each released aggregate instead of the progressive momentum's SGD step (the
  server-side optimizers of the paper's §3.6); it needs ``bb_step_size=False``.
  ``fresh_staleness`` is which gradients count as fresh (see :func:`jaxsync.adaptive_k`):
  0 (the default: computed on the current step), 1, ..., or ``None`` (every arrival);
  the server's dispatch follows the same reading.
  """
  name = "adaptive_k"
  decay = pieces.check_decay(name, weight_decay)
  max_scale = barzilai_borwein.check_max_scale(name, "bb_max_scale", bb_max_scale)
  use_bb = validation.check_bool(name, "bb_step_size", bb_step_size)
  use_armijo = validation.check_bool(name, "armijo", armijo)
  optimizer = validation.check_choice(name, "server_optimizer", server_optimizer, pieces.SERVER_OPTIMIZERS)
  if use_armijo and not use_bb:
    raise validation.invalid(name, "armijo", armijo, "False unless bb_step_size=True")
  if use_bb and optimizer != "sgd":
    raise validation.invalid(
      name,
      "server_optimizer",
      server_optimizer,
      "'sgd' with bb_step_size=True (the workers apply their rates)",
    )
  if max_k is not None:
    max_k = validation.check_int(name, "max_k", max_k)
    if max_k > num_workers:
      raise validation.invalid(name, "max_k", max_k, f"None or an integer in [1, num_workers={num_workers}]")
  if fresh_staleness is not None:
    fresh_staleness = validation.check_int(name, "fresh_staleness", fresh_staleness, low=0)
  # Made here, not with the rate: it checks momentum, theta, confidence and ci_endpoint.
  server = adaptive_k_rule(
    momentum=momentum,
    theta=theta,
    confidence=confidence,
    ci_endpoint=ci_endpoint,
    max_k=max_k or num_workers,
    fresh_staleness=fresh_staleness,
  )
  # An arrival: the gradient read, the fresh mean (or the stale sum) read and written, its squared
  # deviation summed in the same pass; a release: mean, stale sum, momentum (r+w), parameters (r+w).
  traffic = ServerTraffic(pieces.ACCUMULATE_TRAFFIC, 6.0)
  if use_bb:
    # Workers send alpha_i g_i (docs/algorithms.md §11c); the server applies rate 1 (§11b). The decay is
    # the worker's, at the parameters it pulled, so that its own rate scales it.
    def bb_rules(lr):
      bb = barzilai_borwein.bb_step_size(
        lr, smoothing=bb_smoothing, max_scale=max_scale, armijo=use_armijo, server_momentum=momentum
      )
      return optax.chain(server, optax.scale(-1.0)), pieces.decayed(bb, decay)

    blueprint = pieces.asynchronous(
      name,
      num_workers,
      dispatch=Dispatch.ON_RELEASE_FRESH,
      fresh_staleness=fresh_staleness,
      rate_clock=RateClock.WORKER_STEPS,
      gradients_per_update=None,
      server_traffic=traffic,
    )
    return Recipe(blueprint, bb_rules)
  if optimizer == "sgd":
    inner, extra = optax.scale_by_learning_rate, 0.0
  else:
    inner, update_traffic = pieces.server_optimizer(name, optimizer)
    extra = (
      update_traffic - pieces.SGD_TRAFFIC
    )  # the optimizer's own buffers, on top of the momentum's update
  blueprint = pieces.asynchronous(
    name,
    num_workers,
    dispatch=Dispatch.ON_RELEASE_FRESH,
    fresh_staleness=fresh_staleness,
    gradients_per_update=None,
    server_traffic=ServerTraffic(traffic.arrival, traffic.release + extra),
  )
  # on_release: the rate (and its schedule) steps once per release, not per buffered arrival.
  return Recipe(blueprint, lambda lr: (pieces.decayed(on_release(server, inner(lr)), decay), None))
