"""The time model's numbers from measurements: a Gamma jitter, a link's latency and bandwidth, a server's costs."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from jaxsync._src.core import validation
from jaxsync._src.sim.time_model import Link

_WHAT = "calibration"


def gamma_shape(times: np.ndarray) -> float:
  r"""The Gamma shape of step times with the same coefficient of variation: ``mean^2 / var``.

  The time model draws a step as ``c X`` with ``X ~ Gamma(a, 1/a)`` (mean 1,
  coefficient of variation ``1/sqrt(a)``); the method of moments gives
  ``a = (\bar t / s_t)^2``. A spread below 0.1% is treated as 0.1% (shape 1e6:
  practically deterministic).
  """
  times = np.asarray(times, np.float64)
  if times.size < 2 or not np.all(np.isfinite(times)) or np.any(times <= 0):
    raise validation.invalid(_WHAT, "times", times.tolist()[:8], "two or more positive, finite step times")
  cv = max(float(times.std(ddof=1) / times.mean()), 1e-3)
  return 1.0 / cv**2


def link_from_measurements(
  small_round_trip: float, small_bytes: int, stream_bytes: int, stream_seconds: float
) -> Link:
  """Latency and bandwidth from a small message's round trip and a sustained stream.

  A stream of ``S`` bytes each way, echoed as it goes, takes about ``S / B``
  (the two directions overlap): ``B = S / t_stream``. A small message of ``s``
  bytes goes out and back in ``2 (l + s / B)``: ``l = rtt / 2 - s / B``,
  floored at 0.
  """
  for name, value in (("small_round_trip", small_round_trip), ("stream_seconds", stream_seconds)):
    validation.check_real(_WHAT, name, value, low=0.0, low_open=True)
  bandwidth = stream_bytes / stream_seconds
  return Link(latency=max(small_round_trip / 2 - small_bytes / bandwidth, 0.0), bandwidth=float(bandwidth))


def server_costs(per_arrival: Mapping[int, float], arrays: float) -> tuple[float, float | None]:
  r"""``(apply_time, server_bandwidth)`` fitted to the server's seconds per arrival at several sizes.

  The time model charges an arrival ``t_apply + a n / M`` (``a`` parameter-sized
  arrays read and written, ``n`` bytes each): a line through ``(n, t)`` gives
  ``t_apply`` (its intercept, floored at 0) and ``M = a / slope``. Where the
  cost does not grow with the size (a small model, whose arrivals cost the
  server's fixed work per message), ``M`` is None (no memory cost) and
  ``t_apply`` the mean cost.

  Args:
    per_arrival: ``{message bytes: seconds per arrival}``, two or more sizes.
    arrays: ``a``, the measured rule's arrays per arrival (``Strategy.server_traffic``).

  Raises:
    ValueError: fewer than two sizes.
  """
  sizes = np.asarray(sorted(per_arrival), np.float64)
  if sizes.size < 2:
    raise validation.invalid(_WHAT, "per_arrival", sorted(per_arrival), "seconds at two or more sizes")
  seconds = np.asarray([per_arrival[int(n)] for n in sizes])
  slope, intercept = np.polyfit(sizes, seconds, 1)
  if not slope > 0 or intercept < 0:
    # Not separable: no per-byte cost above the noise, or one that the smallest size cannot carry.
    if not slope > 0:
      return float(seconds.mean()), None
    return 0.0, float(arrays * sizes[0] / seconds[0])
  return float(intercept), float(arrays / slope)


def collective_overhead(
  per_size: Mapping[int, float], processes: int, link: Link
) -> tuple[float, dict[int, float]]:
  r"""``(c, excess by size)``: what an all-reduce takes beyond the ring formula, from measured all-reduces.

  The time model charges an all-reduce of ``n`` bytes over ``P`` processes
  ``T_ring = 2 (P-1) (l + n / (P B)) + c`` (the class docstring of
  ``TimeModel``). With the link ``(l, B)`` measured apart, each size's
  excess ``t(n) - 2 (P-1) (l + n / (P B))`` is what the formula misses (gloo's
  own steps, dispatch, waiting for the result); ``c`` is their median, floored
  at 0 (a formula that overestimates charges nothing more).

  Args:
    per_size: ``{bytes: median seconds of one all-reduce}``, one or more sizes.
    processes: ``P >= 2``, the processes the all-reduce spanned.
    link: the measured link between them.

  Raises:
    ValueError: no sizes, or fewer than two processes.
  """
  if not per_size:
    raise validation.invalid(_WHAT, "per_size", dict(per_size), "seconds at one or more sizes")
  processes = validation.check_int(_WHAT, "processes", processes, low=2)
  excess = {
    int(n): float(t) - 2 * (processes - 1) * (link.latency + link.transfer(float(n)) / processes)
    for n, t in sorted(per_size.items())
  }
  return max(float(np.median(list(excess.values()))), 0.0), excess
