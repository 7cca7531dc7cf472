"""jaxsync: synchronization models for data-parallel training, as optax transforms.

Every server or worker rule of the papers is an ``optax.GradientTransformationExtraArgs``
with a ``NamedTuple`` state, pure and jittable. Server rules take the extra arg
``version`` (the server version the gradient was computed on); staleness is
``current_version - version``. Unknown extra args are ignored.

Two kinds of rule (design.md, "Learning-rate placement"):

* *final-update* rules take ``learning_rate`` and return the updates to add
  with ``optax.apply_updates``: :func:`ordered_momentum`, :func:`smega2`,
  :func:`easgd_worker`, :func:`easgd_center`, :func:`ea_wild_center`;
* *direction* rules return a direction for a learning rate chained after them:
  :func:`adaptive_k`, :func:`scale_by_staleness`, :func:`bb_step_size`
  (which returns ``alpha_i g``, the scaled gradient a worker sends).

Rules that are plain optax and therefore not re-implemented here:

=====================  ===========================================================
rule (algorithms.md)   optax form
=====================  ===========================================================
BSP / SSGDm (§1)       ``optax.sgd(lr, momentum)`` on the mean of the K gradients
ASP / ASGD (§2)        ``optax.sgd(lr)`` applied per arrival
naive ASGDm (§3)       ``optax.sgd(lr, momentum)`` applied per arrival
shifted momentum (§4)  worker ``optax.trace(decay=m)``, server ``optax.sgd(lr)``
Hogwild                ``optax.sgd(lr)``, applied without a lock
SMEGA² weight decay    ``optax.add_decayed_weights(wd)`` before :func:`smega2`
=====================  ===========================================================

NaN/Inf policy: jaxsync's own rules reject a non-finite arrival (zeros out, state
unchanged, counted in ``state.nonfinite_count``); wrap a plain optax rule in
``optax.apply_if_finite`` for the same behaviour. Checking costs one read of the
gradient; a caller that already checked it (the runtimes do, on the worker)
passes the extra arg ``grads_finite`` and the rule trusts it.

``import jaxsync`` loads JAX, optax and these rules only; the submodules
:mod:`jaxsync.datasets`, :mod:`jaxsync.dist`, :mod:`jaxsync.models`,
:mod:`jaxsync.sim` and :mod:`jaxsync.strategies` (with flax, ZeroMQ, grain...)
are imported on first use, e.g. ``jaxsync.sim.Simulator``.
"""

import typing as _typing

from jaxsync._src.rules.adaptive_k import AdaptiveKState, adaptive_k
from jaxsync._src.rules.barzilai_borwein import (
  BBStepSizeState,
  armijo_backtracking,
  bb_step_size,
  gradient_noise_ratio,
)
from jaxsync._src.rules.contracts import server_version
from jaxsync._src.rules.elastic import (
  EasgdWorkerState,
  ElasticCenterState,
  ea_wild_center,
  easgd_center,
  easgd_worker,
)
from jaxsync._src.rules.look_ahead import look_ahead
from jaxsync._src.rules.ordered_momentum import OrderedMomentumState, ordered_momentum
from jaxsync._src.rules.release import OnReleaseState, on_release
from jaxsync._src.rules.smega2 import Smega2State, smega2
from jaxsync._src.rules.staleness import ScaleByStalenessState, scale_by_staleness

if _typing.TYPE_CHECKING:  # for type checkers and IDEs; at run time, __getattr__ imports them on first use
  from jaxsync import datasets, dist, models, sim, strategies

__version__ = "0.1.0"
_SUBMODULES = ("datasets", "dist", "models", "sim", "strategies")

__all__ = (
  "AdaptiveKState",
  "BBStepSizeState",
  "EasgdWorkerState",
  "ElasticCenterState",
  "OnReleaseState",
  "OrderedMomentumState",
  "ScaleByStalenessState",
  "Smega2State",
  "adaptive_k",
  "armijo_backtracking",
  "bb_step_size",
  "datasets",
  "ea_wild_center",
  "easgd_center",
  "easgd_worker",
  "gradient_noise_ratio",
  "look_ahead",
  "models",
  "on_release",
  "ordered_momentum",
  "scale_by_staleness",
  "server_version",
  "dist",
  "sim",
  "smega2",
  "strategies",
)


def __getattr__(name: str):
  """Imports the submodule ``name`` on its first use (PEP 562): ``import jaxsync`` stays light."""
  if name in _SUBMODULES:
    import importlib

    return importlib.import_module(f"{__name__}.{name}")
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
  return sorted({*globals(), *__all__})
