"""The fits that turn measurements into the time model's numbers."""

from __future__ import annotations

import numpy as np
import pytest

from jaxsync._src.calibration import fit
from jaxsync._src.sim.time_model import Link


def test_gamma_shape_recovers_the_shape_of_gamma_step_times():
  rng = np.random.default_rng(0)
  for shape in (4.0, 25.0, 100.0):
    times = 0.01 * rng.gamma(shape, 1.0 / shape, size=20_000)
    assert fit.gamma_shape(times) == pytest.approx(shape, rel=0.05)


def test_gamma_shape_of_constant_times_is_large_not_infinite():
  assert fit.gamma_shape(np.full(10, 0.003)) == pytest.approx(1e6)


@pytest.mark.parametrize("times", [[0.1], [0.1, -0.2], [0.1, np.nan]])
def test_gamma_shape_rejects_what_is_not_step_times(times):
  with pytest.raises(ValueError, match="times=.*two or more positive, finite step times"):
    fit.gamma_shape(np.asarray(times))


def test_a_link_from_a_small_round_trip_and_a_stream():
  # 1 Gbit/s and 50 us: a 1 KB round trip takes 2 (50e-6 + 1024 / 1.25e8); 100 MB stream in 0.8 s.
  rtt = 2 * (50e-6 + 1024 / 1.25e8)
  link = fit.link_from_measurements(rtt, 1024, 100_000_000, 0.8)
  assert link.bandwidth == pytest.approx(1.25e8)
  assert link.latency == pytest.approx(50e-6)
  # A round trip shorter than the bytes at that bandwidth: no negative latency.
  assert fit.link_from_measurements(1e-6, 1024, 100_000_000, 0.8).latency == 0.0


def test_server_costs_split_a_fixed_cost_from_memory_traffic():
  # 200 us per arrival plus 3 arrays at 5 GB/s.
  per_arrival = {n: 200e-6 + 3 * n / 5e9 for n in (600_000, 4_800_000)}
  apply_time, bandwidth = fit.server_costs(per_arrival, arrays=3)
  assert apply_time == pytest.approx(200e-6)
  assert bandwidth == pytest.approx(5e9)


def test_server_costs_that_do_not_grow_with_size_are_all_a_fixed_cost():
  apply_time, bandwidth = fit.server_costs({600_000: 1.9e-3, 4_800_000: 1.8e-3}, arrays=3)
  assert bandwidth is None
  assert apply_time == pytest.approx(1.85e-3)


def test_server_costs_need_two_sizes():
  with pytest.raises(ValueError, match="per_arrival=.*two or more sizes"):
    fit.server_costs({600_000: 1e-3}, arrays=3)


def test_collective_overhead_is_the_median_excess_over_the_ring_formula():
  link = Link(latency=1e-4, bandwidth=1e8)
  ring = lambda n: 2 * 2 * (1e-4 + n / 3 / 1e8)  # noqa: E731 - three processes
  measured = {4096: ring(4096) + 0.002, 600_000: ring(600_000) + 0.003, 2_400_000: ring(2_400_000) + 0.010}
  overhead, excess = fit.collective_overhead(measured, 3, link)
  assert overhead == pytest.approx(0.003)
  assert excess[2_400_000] == pytest.approx(0.010)
  # A formula that overestimates charges nothing more.
  assert fit.collective_overhead({4096: 0.5 * ring(4096)}, 3, link)[0] == 0.0


@pytest.mark.parametrize(
  ("sizes", "processes", "match"), [({}, 3, "per_size"), ({4096: 0.01}, 1, "processes=1")]
)
def test_collective_overhead_needs_sizes_and_two_processes(sizes, processes, match):
  with pytest.raises(ValueError, match=match):
    fit.collective_overhead(sizes, processes, Link(latency=0.0, bandwidth=1e9))
