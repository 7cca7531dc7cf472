"""A measured cluster: the time model's numbers from this machine (and its network), with where each came from."""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import socket
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from jaxsync._src.calibration import fit, probes
from jaxsync._src.core import validation
from jaxsync._src.sim.time_model import Link
from jaxsync._src.strategies import registry as strategies

_WHAT = "calibrate"


@dataclasses.dataclass(frozen=True)
class Calibration:
  """The time model's numbers, measured.

  Attributes:
    compute_time: mean seconds of one worker-step.
    jitter_shape: the Gamma shape with the steps' coefficient of variation.
    link: the link's latency and bandwidth.
    apply_time: the server's fixed seconds per arrival.
    server_bandwidth: bytes per second of the server's memory traffic (None: its cost did not grow
      with the message size, all of it is ``apply_time``).
    sources: for each of them, how it was measured (what ``cluster.calibration`` holds).
    eval_time: seconds of one evaluation on the held-out data (0: not measured).
    collective_overhead: seconds an all-reduce takes beyond the ring formula on ``link`` (0: not measured).
    server_link: the server's card as several workers share it (None: not measured; the clock uses ``link``).
  """

  compute_time: float
  jitter_shape: float
  link: Link
  apply_time: float
  server_bandwidth: float | None
  sources: dict[str, str]
  eval_time: float = 0.0
  collective_overhead: float = 0.0
  server_link: Link | None = None

  def cluster_section(self) -> dict[str, Any]:
    """The ``cluster:`` keys of a config (``train``, ``compare`` and ``advise`` take them as they are)."""
    return {
      "compute_time": _round(self.compute_time),
      "jitter_shape": _round(self.jitter_shape),
      "link": {"latency": _round(self.link.latency), "bandwidth": _round(self.link.bandwidth)},
      **(
        {}
        if self.server_link is None
        else {
          "server_link": {
            "latency": _round(self.server_link.latency),
            "bandwidth": _round(self.server_link.bandwidth),
          }
        }
      ),
      "apply_time": _round(self.apply_time),
      "server_bandwidth": None if self.server_bandwidth is None else _round(self.server_bandwidth),
      "eval_time": _round(self.eval_time),
      "collective_overhead": _round(self.collective_overhead),
      "calibration": dict(self.sources),
    }


def _round(x: float) -> float:
  return float(f"{x:.4g}")


def machine() -> str:
  """Where a measurement ran: host name, cores, JAX and its backend, date."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return (
    f"{socket.gethostname()} ({platform.machine()}, {cores} cores, JAX {jax.__version__} "
    f"{jax.default_backend()}), {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC"
  )


def compute_from(
  times: np.ndarray, *, processes: int, batch_size: int, probe_slowdowns: Sequence[float] = ()
) -> tuple[float, float, str]:
  """``(compute_time, jitter_shape, source)`` of measured step times (:func:`probes.step_times`, pooled
  over ``processes`` processes that measured at once, those with a ``probe_slowdowns`` factor above 1
  emulating a slow worker)."""
  times = np.asarray(times, np.float64)
  mean, shape = float(times.mean()), fit.gamma_shape(times)
  slow = [f for f in probe_slowdowns if f > 1.0]
  emulated = (
    f" ({len(slow)} of them an emulated slow worker, sleeping {max(slow) - 1:g}x each step as in a run)"
    if slow
    else ""
  )
  source = (
    f"measured: {times.size} steps of the model's gradient on batches of {batch_size}, "
    f"{processes} process(es) at once{emulated} on {machine()}; mean {mean * 1e3:.3f} ms, "
    f"coefficient of variation {1 / np.sqrt(shape):.3f}"
  )
  return mean, shape, source


def measure_link(message_bytes: int, *, link_to: str | None = None, rounds: int = 20) -> tuple[Link, str]:
  """The link from ``rounds`` round trips of 1 KB (latency) and a stream of messages of ``message_bytes``,
  at least 32 MB in all (bandwidth); ``link_to``: a remote :class:`probes.EchoServer` (``jaxsync calibrate
  --serve-echo``), default a local one (loopback)."""
  message_bytes = validation.check_int(_WHAT, "message_bytes", message_bytes, low=1)
  count = max(20, -(-(32 << 20) // message_bytes))
  echo = None if link_to else probes.EchoServer().start()
  try:
    address = link_to or echo.address
    small = float(np.median(probes.round_trips(address, [1024], rounds=rounds)[1024]))
    seconds = probes.stream_seconds(address, message_bytes, count)
  finally:
    if echo is not None:
      echo.stop()
  link = fit.link_from_measurements(small, 1024, count * message_bytes, seconds)
  where = f"to {link_to}" if link_to else "over loopback (one machine)"
  source = (
    f"measured: ZeroMQ messages {where}: {rounds} round trips of 1 KB (median {small * 1e6:.0f} us) for the "
    f"latency, {count} messages of {message_bytes:,} bytes streamed and echoed ({seconds:.3f} s) for the "
    f"bandwidth; from {machine()}"
  )
  return link, source


def measure_shared_card(
  message_bytes: int, link: Link, *, link_to: str, senders: int, seconds: float = 5.0
) -> tuple[Link, str]:
  """The echo's card at ``link_to`` shared by ``senders`` hosts at once (:func:`probes.shared_card`: this
  one and ``senders - 1`` ``jaxsync calibrate --stream-peer`` processes), each with one message of
  ``message_bytes`` in flight: a :class:`Link` with ``link``'s latency and the bandwidth the card moved."""
  senders = validation.check_int(_WHAT, "senders", senders, low=2)
  got = probes.shared_card(link_to, message_bytes, senders, seconds=seconds)
  shared = Link(latency=link.latency, bandwidth=got["bytes"] / got["seconds"])
  source = (
    f"measured: {got['senders']} senders at once (this host and `jaxsync calibrate --stream-peer` on the others) "
    f"pushing {message_bytes:,}-byte messages to the echo at {link_to}, each waiting for its echo as a worker "
    f"waits for its reply: {got['messages']} messages in {got['seconds']:.2f} s, "
    f"{shared.bandwidth * 8e-6:.0f} Mbit/s each way ({shared.bandwidth / link.bandwidth:.2f}x one stream's); "
    f"from {machine()}"
  )
  return shared, source


def measure_server(message_bytes: int, *, rounds: int = 30) -> tuple[float, float | None, str]:
  """``(apply_time, server_bandwidth, source)``: the real parameter server's seconds per arrival of an
  ``asp`` push at the model's size and 8 times it, less an echo's of the same sockets, fitted to
  ``apply_time + arrays x bytes / server_bandwidth``."""
  message_bytes = validation.check_int(_WHAT, "message_bytes", message_bytes, low=4)
  asp = strategies.make("asp", 1, learning_rate=1e-3)
  arrays = asp.server_traffic.arrival + asp.server_traffic.release
  per_arrival, notes = {}, []
  for size in (message_bytes, 8 * message_bytes):
    times = probes.server_times(size // 4, strategy="asp", rounds=rounds)
    # The server's own time: a push and pull through it, less one through an echo doing no work.
    per_arrival[4 * (size // 4)] = max(float(np.median(times["server"]) - np.median(times["echo"])), 1e-7)
    notes.append(f"{size:,} bytes: {per_arrival[4 * (size // 4)] * 1e6:.0f} us")
  apply_time, bandwidth = fit.server_costs(per_arrival, arrays)
  fitted = (
    f"fitted to apply_time + {arrays:g} arrays x bytes / server_bandwidth"
    if bandwidth is not None
    else "no growth with the size above the noise: all of it apply_time"
  )
  source = (
    f"measured: the parameter server's seconds per asp arrival less a ZeroMQ echo's ({'; '.join(notes)}; "
    f"{rounds} pushes each), {fitted}, on {machine()}"
  )
  return apply_time, bandwidth, source


def calibrate(
  loss_fn: Callable[[Any, Any], Any],
  params: Any,
  batch_of: Callable[[int], Any],
  *,
  batch_size: int,
  steps: int = 100,
  step_seconds: np.ndarray | None = None,
  processes: int = 1,
  probe_slowdowns: Sequence[float] = (),
  link_to: str | None = None,
  rounds: int = 20,
  eval_fn: Callable[[Any], Any] | None = None,
  link_senders: int = 1,
) -> Calibration:
  """Measures this machine (and the link to ``link_to``) for the time model.

  Compute: ``steps`` jitted gradients of ``loss_fn`` (or the given
  ``step_seconds``, e.g. pooled from ``processes`` processes that measured at
  once), fitted to a mean and a Gamma jitter. Link: ZeroMQ round trips
  (:func:`measure_link`). Server: the real parameter server's time per arrival
  (:func:`measure_server`).

  Args:
    loss_fn: ``(params, batch) -> scalar``.
    params: the model's parameters (their bytes are one message).
    batch_of: ``step -> batch`` of one worker.
    batch_size: the batch's examples (for the record).
    steps: steps timed when ``step_seconds`` is not given.
    step_seconds: step times measured elsewhere.
    processes: how many processes measured ``step_seconds`` at once.
    probe_slowdowns: those processes' emulated slowdowns (above 1: a slow
      worker's probe that slept between its steps), for the record.
    link_to: a remote echo's ``tcp://host:port``; default loopback.
    rounds: round trips per message size.
    eval_fn: ``params -> metrics`` on the held-out data; its jitted time is
      ``eval_time`` (what a run pays per evaluation). None: not measured (0).
    link_senders: above 1 (with ``link_to``), also the echo's card shared by
      that many senders at once, kept as ``server_link``
      (:func:`measure_shared_card`): what a parameter server's interface
      moves when its workers push at once.

  Returns:
    A :class:`Calibration`; ``.cluster_section()`` is a config's ``cluster:`` keys.

  Example:
    >>> cal = jaxsync.calibration.calibrate(loss_fn, params, lambda i: batches[i], batch_size=32)  # doctest: +SKIP
    >>> yaml.safe_dump({"cluster": cal.cluster_section()})  # doctest: +SKIP
  """
  if step_seconds is None:
    step_seconds = probes.step_times(loss_fn, params, batch_of, steps=steps)
  compute_time, jitter, compute_source = compute_from(
    step_seconds, processes=processes, batch_size=batch_size, probe_slowdowns=probe_slowdowns
  )
  message_bytes = int(sum(np.dtype(x.dtype).itemsize * np.size(x) for x in jax.tree.leaves(params)))
  link_senders = validation.check_int(_WHAT, "link_senders", link_senders, low=1)
  if link_senders > 1 and link_to is None:
    raise ValueError(
      f"{_WHAT}: {link_senders=} needs link_to (an echo on another host, which the other senders reach too)"
    )
  link, link_source = measure_link(message_bytes, link_to=link_to, rounds=rounds)
  sources, shared = {}, None
  if link_senders > 1:
    shared, sources["server_link"] = measure_shared_card(
      message_bytes, link, link_to=link_to, senders=link_senders
    )
  apply_time, bandwidth, server_source = measure_server(message_bytes)
  eval_time = 0.0
  if eval_fn is not None:
    times = probes.evaluation_times(eval_fn, params)
    eval_time = float(np.median(times))
    sources["eval_time"] = (
      f"measured: the median of {times.size} jitted evaluations on the held-out data "
      f"({eval_time * 1e3:.1f} ms) on {machine()}"
    )
  return Calibration(
    compute_time=compute_time,
    jitter_shape=jitter,
    link=link,
    apply_time=apply_time,
    server_bandwidth=bandwidth,
    sources={
      "compute_time": compute_source,
      "jitter_shape": "the compute times' coefficient of variation (Gamma shape = 1 / CV^2)",
      "link": link_source,
      "apply_time": server_source,
      "server_bandwidth": "with apply_time (the same measurement)",
      **sources,
    },
    eval_time=eval_time,
    server_link=shared,
  )
