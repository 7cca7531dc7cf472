"""jaxsync: the synchronization rules of distributed SGD, as optax transforms.

Each rule of the distributed-SGD papers that plain optax cannot express (ordered
momentum, SMEGA², adaptive k-synchronization, staleness-aware rates, elastic
averaging, per-worker Barzilai-Borwein step sizes) is an
``optax.GradientTransformationExtraArgs`` with a ``NamedTuple`` state, pure and
jittable. Use one wherever an optax optimizer goes: in your own loop with
``optax.apply_updates``, in ``flax.nnx.Optimizer``, in a Linen ``TrainState``,
or as the server or worker rule of jaxsync's simulator (:mod:`jaxsync.sim`) and
runtimes (:mod:`jaxsync.dist`).

Versions and staleness. A server rule measures how stale a gradient is against
a version it counts itself: the server sends :func:`server_version` with its
parameters and passes it back as the extra arg ``version`` of ``update`` when
the gradient computed on them arrives; the staleness is ``current_version -
version``. In an ordinary single-process loop leave it out: a gradient without
``version`` is fresh (staleness 0), so
``nnx.Optimizer(model, jaxsync.ordered_momentum(0.05, 0.9, num_workers=1), wrt=nnx.Param)``
trains as heavy-ball momentum. Unknown extra args are ignored.

Composing rules. A chain (``optax.chain``, wrappers, :func:`on_release`'s
buffer) holds at most one rule that counts server versions
(:func:`ordered_momentum`, :func:`smega2`, :func:`adaptive_k`,
:func:`scale_by_staleness`); its count is the chain's version. Two are
refused (:func:`server_version` raises, :func:`on_release` refuses at
``init``): the second would count the first's outputs, idle zeros included,
as arrivals of its own. After a buffering rule put a stateless learning rate
(``optax.chain(jaxsync.adaptive_k(), optax.scale_by_learning_rate(lr))``), or
any optimizer through :func:`on_release`, whose inner sees each release as one
fresh gradient and counts releases itself:
``jaxsync.on_release(jaxsync.adaptive_k(momentum=0.0), jaxsync.ordered_momentum(lr, 0.9, num_workers=1))``.

Two kinds of rule:

* *final-update* rules take ``learning_rate`` and return the updates to add
  with ``optax.apply_updates``: :func:`ordered_momentum`, :func:`smega2`,
  :func:`easgd_worker`, :func:`easgd_center`, :func:`ea_wild_center`;
* *direction* rules return a direction for a learning rate chained after them:
  :func:`adaptive_k`, :func:`scale_by_staleness`, :func:`bb_step_size`
  (which returns ``alpha_i g``, the scaled gradient a worker sends).

Rules that are plain optax and therefore not re-implemented here (each is
described in the Algorithms page of the jaxsync documentation, in the section
named):

* BSP / synchronous SGD with momentum: ``optax.sgd(lr, momentum)`` on the mean
  of the K gradients (section '1. BSP / synchronous SGD with momentum');
* ASP / asynchronous SGD, and Hogwild: ``optax.sgd(lr)`` applied per arrival
  (section '2. ASP / asynchronous SGD');
* naive asynchronous SGD with momentum: ``optax.sgd(lr, momentum)`` applied per
  arrival (section '3. Naive ASGDm');
* shifted momentum: worker ``optax.trace(decay=m)``, server ``optax.sgd(lr)``
  (section '4. Shifted momentum');
* SMEGA²'s weight decay: ``optax.add_decayed_weights(wd)`` before
  :func:`smega2` (section '5. SMEGA²').

NaN/Inf policy: jaxsync's own rules reject a non-finite arrival (zeros out, state
unchanged, counted in ``state.nonfinite_count``); wrap a plain optax rule in
``optax.apply_if_finite`` for the same behaviour. Checking costs one read of the
gradient; a caller that already checked it (the runtimes do, on the worker)
passes the extra arg ``grads_finite`` and the rule trusts it.

``import jaxsync`` loads nothing heavy: a rule's first use (``jaxsync.ordered_momentum``)
imports JAX, optax and the rules, and the submodules :mod:`jaxsync.datasets`,
:mod:`jaxsync.dist`, :mod:`jaxsync.models`, :mod:`jaxsync.sim`,
:mod:`jaxsync.calibration` and :mod:`jaxsync.strategies` (with flax, ZeroMQ, grain...) are imported on first
use, e.g. ``jaxsync.sim.Simulator``. So the command line answers ``--help`` at once.
"""

# For the maintainers: the two kinds of rule, docs/design.md, "Learning-rate placement".

import typing as _typing

# Where each public rule lives (jaxsync/_src/rules/MODULE.py): imported on first use, with JAX and optax.
_RULES = {
  "AdaptiveKState": "adaptive_k",
  "adaptive_k": "adaptive_k",
  "BBStepSizeState": "barzilai_borwein",
  "DelayCompensationState": "delay_compensation",
  "dc_asgd": "delay_compensation",
  "DelayedNesterovState": "delayed_nesterov",
  "delayed_nesterov": "delayed_nesterov",
  "DilocoState": "diloco",
  "diloco": "diloco",
  "armijo_backtracking": "barzilai_borwein",
  "bb_step_size": "barzilai_borwein",
  "gradient_noise_ratio": "barzilai_borwein",
  "server_version": "contracts",
  "EasgdWorkerState": "elastic",
  "ElasticCenterState": "elastic",
  "ea_wild_center": "elastic",
  "easgd_center": "elastic",
  "easgd_worker": "elastic",
  "look_ahead": "look_ahead",
  "OrderedMomentumState": "ordered_momentum",
  "ordered_momentum": "ordered_momentum",
  "OnReleaseState": "release",
  "on_release": "release",
  "Smega2State": "smega2",
  "smega2": "smega2",
  "ScaleByStalenessState": "staleness",
  "scale_by_staleness": "staleness",
}

# Running a whole config from Python (a notebook, a script), as `jaxsync train` does.
_APP = {
  "train_config": "jaxsync._src.app.commands",
  "load_model": "jaxsync._src.app.trained_model",
  "plan": "jaxsync._src.plan.planner",
}

if _typing.TYPE_CHECKING:  # for type checkers and IDEs; at run time, __getattr__ imports them on first use
  from jaxsync import calibration, datasets, dist, models, planning, sim, strategies
  from jaxsync._src.app.commands import train_config
  from jaxsync._src.app.trained_model import load_model
  from jaxsync._src.plan.planner import plan
  from jaxsync._src.rules.adaptive_k import AdaptiveKState, adaptive_k
  from jaxsync._src.rules.barzilai_borwein import (
    BBStepSizeState,
    armijo_backtracking,
    bb_step_size,
    gradient_noise_ratio,
  )
  from jaxsync._src.rules.contracts import server_version
  from jaxsync._src.rules.delay_compensation import DelayCompensationState, dc_asgd
  from jaxsync._src.rules.delayed_nesterov import DelayedNesterovState, delayed_nesterov
  from jaxsync._src.rules.diloco import DilocoState, diloco
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

__version__ = "0.1.0"
_SUBMODULES = ("calibration", "datasets", "dist", "models", "planning", "sim", "strategies")

__all__ = (
  "AdaptiveKState",
  "BBStepSizeState",
  "DelayCompensationState",
  "DelayedNesterovState",
  "DilocoState",
  "EasgdWorkerState",
  "ElasticCenterState",
  "OnReleaseState",
  "OrderedMomentumState",
  "ScaleByStalenessState",
  "Smega2State",
  "adaptive_k",
  "armijo_backtracking",
  "bb_step_size",
  "calibration",
  "datasets",
  "dc_asgd",
  "delayed_nesterov",
  "diloco",
  "ea_wild_center",
  "easgd_center",
  "easgd_worker",
  "gradient_noise_ratio",
  "load_model",
  "look_ahead",
  "models",
  "on_release",
  "ordered_momentum",
  "plan",
  "planning",
  "scale_by_staleness",
  "server_version",
  "dist",
  "sim",
  "smega2",
  "strategies",
  "train_config",
)


def __getattr__(name: str):
  """Imports a rule or a submodule on its first use (PEP 562): ``import jaxsync`` loads no JAX."""
  import importlib

  if name in _RULES or name in _APP:
    module = _APP.get(name) or f"{__name__}._src.rules.{_RULES[name]}"
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later uses are plain attribute reads
    return value
  if name in _SUBMODULES:
    return importlib.import_module(f"{__name__}.{name}")
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
  return sorted({*globals(), *__all__})
