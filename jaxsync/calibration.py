"""jaxsync.calibration: measure a machine for the simulator, and compare a simulated run with a real one.

:func:`calibrate` measures what the simulator's clock (:class:`jaxsync.sim.TimeModel`)
needs, on the machine it runs on: a model's compute time per step and its
spread, a link's latency and bandwidth (to an :class:`EchoServer` on another
host, or over loopback), and the parameter server's time per arrival. Its
:class:`Calibration` gives a config's ``cluster:`` keys, each with where it
came from (``jaxsync calibrate`` writes them). :func:`measures` reads a run's
event records (a simulated run's, or a real run's final checkpoint) and
:func:`compare` sets a real run against simulated runs of the same config:
gradients and updates per second, staleness, time to a target accuracy and
accuracy at equal time.
"""

from jaxsync._src.calibration.agreement import (
  RunMeasures,
  accuracy_at,
  compare,
  measures,
  time_to_hold,
  total_variation,
)
from jaxsync._src.calibration.calibration import Calibration, calibrate, measure_link, measure_server
from jaxsync._src.calibration.fit import gamma_shape, link_from_measurements, server_costs
from jaxsync._src.calibration.probes import EchoServer, round_trips, server_times, step_times, stream_seconds

__all__ = [
  "Calibration",
  "EchoServer",
  "RunMeasures",
  "accuracy_at",
  "calibrate",
  "compare",
  "gamma_shape",
  "link_from_measurements",
  "measure_link",
  "measure_server",
  "measures",
  "round_trips",
  "server_costs",
  "server_times",
  "step_times",
  "stream_seconds",
  "time_to_hold",
  "total_variation",
]
