"""Which strategy to use: short simulated runs of the candidates, extrapolated to a target, ranked.

A *short run* is the beginning of the run a user plans: the same strategy,
model, data, cluster and seed, stopped after a fraction of the gradients. The
simulator is deterministic (chunks equal one call), so what a short run
measures is exactly what the full run would show up to that point; the only
guess is what comes after it. Each candidate gets the same number of worker
gradients, so each costs the same to simulate, and its own clock decides how
much simulated time that covers.

From each short run's evaluations the advisor reads the time (and server
updates) at which the target is first reached, interpolated between the two
evaluations around it. When a run ends before the target, it extrapolates
with a power law of the error against time, ``1 - accuracy ~ a t^b`` (or
``loss ~ a t^b`` for a loss target), fitted by least squares on the log-log
points of the second half of the run. Learning curves of SGD follow power
laws over long stretches, but a schedule that decays the learning rate after
the short run (a step at half the run) lifts the curve in a way its beginning
cannot show: the further an estimate reaches beyond its run, the weaker it
is, and the table says how far each one reaches.

Seeds give the uncertainty: each strategy's estimate is the median over seeds,
with the smallest and largest of them as its range. The pick is *decisive*
when its range lies entirely before the runner-up's; otherwise the advice
says which candidates it cannot separate.

References:
  Domhan, Springenberg, Hutter, "Speeding up automatic hyperparameter
  optimization of deep neural networks by extrapolation of learning curves",
  IJCAI 2015 (learning curves extrapolated from their beginning; the power
  law is one of their parametric families).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import optax

from jaxsync._src.core import validation
from jaxsync._src.data.worker_data import WorkerData
from jaxsync._src.interface.history import History
from jaxsync._src.sim.simulator import Simulator
from jaxsync._src.sim.time_model import TimeModel
from jaxsync._src.steps.records import EvalSchedule
from jaxsync._src.strategies.strategy import Strategy

_WHAT = "advise"
_MIN_FIT_POINTS = 3


@dataclasses.dataclass(frozen=True)
class Estimate:
  """One candidate's outlook, over its seeds.

  Attributes:
    strategy: the candidate's label.
    seconds: median over seeds of the time to the target (``inf``: not
      expected to reach it); in budget mode, the time budget.
    seconds_range: ``(smallest, largest)`` of the seeds' estimates.
    updates: median server updates to the target (``None`` in budget mode or
      when not expected).
    value: median of the metric at the budget (budget mode), or at the end
      of the short runs (target mode).
    value_range: ``(smallest, largest)`` of the seeds' ``value``.
    reached: seeds whose short run reached the target.
    seeds: seeds run.
    reach: how far the median estimate lies beyond the short runs, as a
      multiple of their length (``<= 1``: measured, no extrapolation).
    diverged: seeds whose run diverged (non-finite loss, or accuracy at
      chance); their estimate is ``inf``.
    run_updates: median server updates in a short run: under
      ``FEW_UPDATES`` (a DiLoCo with a long period, a short run) the estimate
      rests on too few points to trust, and the advice says so.
  """

  strategy: str
  seconds: float
  seconds_range: tuple[float, float]
  updates: float | None
  value: float
  value_range: tuple[float, float]
  reached: int
  seeds: int
  reach: float
  diverged: int
  run_updates: float = math.nan


@dataclasses.dataclass(frozen=True)
class Advice:
  """The ranked candidates, the pick and why.

  Attributes:
    ranking: every candidate's :class:`Estimate`, best first.
    metric, target: the target (``target`` is ``None`` in budget mode).
    time_budget: the budget of budget mode, else ``None``.
    recommended: the best candidate's label.
    decisive: whether its range lies wholly before the runner-up's.
    tied: the candidates it cannot be separated from (empty when decisive).
    reason: one or two sentences a user can act on.
    clock: the runs' clock (``"simulated"``).
  """

  ranking: tuple[Estimate, ...]
  metric: str
  target: float | None
  time_budget: float | None
  recommended: str
  decisive: bool
  tied: tuple[str, ...]
  reason: str
  clock: str = "simulated"

  def table(self) -> str:
    """The ranking as a markdown table."""
    if self.target is not None:
      header = [
        "rank",
        "strategy",
        f"{self.clock} s to {_shown(self.metric)} {self.target:g} (range)",
        "updates",
        "seeds reached",
        "reach",
        f"{_shown(self.metric)} at end",
      ]
    else:
      header = ["rank", "strategy", f"{_shown(self.metric)} at {self.time_budget:g} s (range)", "reach"]
    rows = []
    for i, e in enumerate(self.ranking, 1):
      diverged = f" ({e.diverged} diverged)" if e.diverged else ""
      reach = "measured" if e.reach <= 1 else f"{e.reach:.1f}x" if math.isfinite(e.reach) else "-"
      if self.target is not None:
        rows.append(
          [
            str(i),
            e.strategy + diverged,
            _range_text(e.seconds, e.seconds_range),
            "-" if e.updates is None else f"{e.updates:.0f}",
            f"{e.reached}/{e.seeds}",
            reach,
            _range_text(e.value, e.value_range, 3, target=self.target, higher=_higher_is_better(self.metric)),
          ]
        )
      else:
        rows.append([str(i), e.strategy + diverged, _range_text(e.value, e.value_range, 4), reach])
    lines = ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * (len(header) - 2)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _range_text(
  value: float,
  bounds: tuple[float, float],
  digits: int = 2,
  *,
  target: float | None = None,
  higher: bool = True,
) -> str:
  """``value (low-high)`` with ``digits`` decimals; with a ``target``, each number printed on its side of it.

  An accuracy of 0.9499 is not 0.950 next to "0/2 seeds reached 0.95": up to
  three more decimals are printed where rounding would cross the target, and
  past that each number is rounded away from the target (floored below an
  accuracy target, raised above it).
  """
  if not math.isfinite(value):
    return "not expected"
  low, high = bounds
  shown = [x for x in (value, low, high) if math.isfinite(x)]
  digits = _digits_for(shown, digits, target, higher)
  text = lambda x: _fixed(x, digits, target, higher)
  if low == high or not (math.isfinite(low) and math.isfinite(high)):
    return text(value) + ("" if low == high else " (a seed: not expected)")
  return f"{text(value)} ({text(low)}-{text(high)})"


_MORE_DIGITS = 3


def _reaches(x: float, target: float, higher: bool) -> bool:
  return x >= target if higher else x <= target


def _digits_for(values: Sequence[float], digits: int, target: float | None, higher: bool) -> int:
  """The fewest decimals from ``digits`` (at most 3 more) at which no rounded value crosses ``target``."""
  if target is None:
    return digits
  for d in range(digits, digits + _MORE_DIGITS + 1):
    if all(_reaches(float(f"{x:.{d}f}"), target, higher) == _reaches(x, target, higher) for x in values):
      return d
  return digits + _MORE_DIGITS


def _fixed(x: float, digits: int, target: float | None, higher: bool) -> str:
  """``x`` with ``digits`` decimals, rounded away from ``target`` where plain rounding would cross it."""
  text = f"{x:.{digits}f}"
  if target is None or _reaches(float(text), target, higher) == _reaches(x, target, higher):
    return text
  scale = 10.0**digits
  away = math.floor(x * scale) if float(text) > x else math.ceil(x * scale)
  return f"{away / scale:.{digits}f}"


def _higher_is_better(metric: str) -> bool:
  return metric != "loss"


def _gap(values: np.ndarray, metric: str) -> np.ndarray:
  """What falls towards zero as training goes on: the error ``1 - accuracy``, or the loss itself."""
  return 1.0 - values if _higher_is_better(metric) else values


def _power_law(x: np.ndarray, gap: np.ndarray) -> tuple[float, float] | None:
  """``(b, log a)`` of ``gap ~ a x^b`` on the second half of the points with ``x > 0``, or None."""
  keep = (x > 0) & np.isfinite(gap) & (gap > 0)
  x, gap = x[keep], gap[keep]
  if len(x) < _MIN_FIT_POINTS:
    return None
  half = max(_MIN_FIT_POINTS, len(x) // 2)
  b, log_a = np.polyfit(np.log(x[-half:]), np.log(gap[-half:]), 1)
  return float(b), float(log_a)


# Fewer server updates than this in a candidate's short run and its estimate is flagged as coarse.
FEW_UPDATES = 4


def _first_crossing(
  x: np.ndarray, values: np.ndarray, target: float, higher: bool, updates: np.ndarray
) -> float | None:
  """``x`` where ``values`` first reaches ``target``: interpolated over the updates since the evaluation
  before, rounded up to a whole update.

  The model changes only at server updates, so the metric is a step function of them: with many
  updates between two evaluations this is the linear interpolation, with one (a DiLoCo round, a BSP
  round evaluated every round) it is the evaluation itself, not a point before the update happened.
  """
  hit = values >= target if higher else values <= target
  if not hit.any():
    return None
  i = int(np.argmax(hit))
  if i == 0:
    return float(x[0])
  x0, x1, v0, v1 = x[i - 1], x[i], values[i - 1], values[i]
  steps = updates[i] - updates[i - 1]
  if v1 == v0 or steps <= 0:
    return float(x1)
  needed = math.ceil((target - v0) / (v1 - v0) * steps - 1e-9)  # whole updates into the interval
  return float(x0 + (x1 - x0) * min(needed, steps) / steps)


def _shown(metric: str) -> str:
  """A metric's name in a sentence: ``validation_accuracy`` reads "validation accuracy"."""
  return metric.replace("_", " ")


def diverged(history: History, metric: str, chance: float | None = None) -> bool:
  """Whether a run's last evaluation or the training losses of its last tenth are non-finite, or its
  accuracy ended at most 1.5x ``chance``."""
  values = history.eval_metrics.get(metric, np.zeros(0))
  tail = max(1, len(history.loss) // 10)
  loss = np.asarray(history.loss[-tail:])[~np.asarray(history.rejected[-tail:], bool)]
  if (len(values) and not np.isfinite(values[-1])) or not np.isfinite(loss).all():
    return True
  accuracy = history.eval_metrics.get(metric if metric.endswith("accuracy") else "accuracy")
  return chance is not None and accuracy is not None and len(accuracy) > 1 and accuracy[-1] <= 1.5 * chance


def _one_seed(
  history: History, metric: str, target: float | None, time_budget: float | None, chance: float | None
) -> tuple[float, float | None, float, bool]:
  """``(seconds, updates, value, reached)`` of one short run: measured, extrapolated, or inf."""
  if metric not in history.eval_metrics:
    raise ValueError(
      f"{_WHAT}: metric={metric!r} is not evaluated; expected one of {sorted(history.eval_metrics)}."
    )
  t = np.asarray(history.eval_time, np.float64)
  u = np.asarray(history.eval_version, np.float64)
  values = np.asarray(history.eval_metrics[metric], np.float64)
  end_value = float(values[-1]) if len(values) else math.nan
  if diverged(history, metric, chance):
    return math.inf, None, end_value, False
  higher = _higher_is_better(metric)
  if time_budget is not None:  # the metric at the budget: read off the run, or extrapolated to it
    if t[-1] >= time_budget:
      return time_budget, None, float(np.interp(time_budget, t, values)), True
    fit = _power_law(t, _gap(values, metric))
    if fit is None or fit[0] >= 0:
      return time_budget, None, end_value, False
    gap = math.exp(fit[1]) * time_budget ** fit[0]
    return time_budget, None, (1.0 - gap if higher else gap), False
  seconds = _first_crossing(t, values, target, higher, u)
  if seconds is not None:
    return seconds, _first_crossing(u, values, target, higher, u), end_value, True
  wanted = _gap(np.asarray(target), metric)
  out = []
  for x in (t, u):
    fit = _power_law(x, _gap(values, metric))
    if fit is None or fit[0] >= 0 or wanted <= 0:  # too few points, not improving, or unreachable
      out.append(math.inf)
    else:  # a nearly flat fit puts the target beyond any float: never, not an OverflowError
      log_x = (math.log(wanted) - fit[1]) / fit[0]
      out.append(math.exp(log_x) if log_x < 700 else math.inf)
  return out[0], (out[1] if math.isfinite(out[1]) else None), end_value, False


def estimate(
  name: str,
  histories: Sequence[History],
  *,
  metric: str = "accuracy",
  target: float | None = None,
  time_budget: float | None = None,
  chance: float | None = None,
) -> Estimate:
  """One candidate's :class:`Estimate` from its short runs (one :class:`History` per seed).

  Args:
    name: the candidate's label.
    histories: its short runs, one per seed.
    metric: an evaluated metric (``"accuracy"``, or ``"loss"``: lower is better).
    target: target mode: the value to reach.
    time_budget: budget mode (instead of ``target``): the metric at this time.
    chance: the accuracy of a guess; a run ending at most 1.5x above it diverged.

  Returns:
    The median over seeds, its range, and how far it reaches beyond the runs.
  """
  if (target is None) == (time_budget is None):
    raise ValueError(f"{_WHAT}: {target=} and {time_budget=}; expected exactly one of them.")
  if not histories:
    raise ValueError(f"{_WHAT}: {name!r} has no runs; expected one history per seed.")
  seeds = [_one_seed(h, metric, target, time_budget, chance) for h in histories]
  seconds = np.asarray([s[0] for s in seeds])
  updates = [s[1] for s in seeds]
  values = np.asarray([s[2] for s in seeds])
  run_length = float(np.median([h.elapsed for h in histories])) or math.nan
  median_seconds = float(np.median(seconds))
  known_updates = [x for x in updates if x is not None]
  return Estimate(
    strategy=name,
    seconds=median_seconds,
    seconds_range=(float(seconds.min()), float(seconds.max())),
    updates=float(np.median(known_updates)) if len(known_updates) == len(updates) else None,
    value=float(np.nanmedian(values)) if np.isfinite(values).any() else math.nan,
    value_range=(float(np.nanmin(values)), float(np.nanmax(values)))
    if np.isfinite(values).any()
    else (math.nan, math.nan),
    reached=sum(s[3] for s in seeds),
    seeds=len(seeds),
    reach=median_seconds / run_length if run_length > 0 else math.inf,
    diverged=sum(diverged(h, metric, chance) for h in histories),
    run_updates=float(np.median([h.updates for h in histories])),
  )


def rank(
  runs: Mapping[str, Sequence[History]],
  *,
  metric: str = "accuracy",
  target: float | None = None,
  time_budget: float | None = None,
  chance: float | None = None,
) -> Advice:
  """Ranks candidates from their short runs and picks one, saying why and how sure.

  Target mode ranks by the median time to ``target`` (sooner is better; ties
  broken by the metric at the end of the runs); budget mode by the median
  metric at ``time_budget``. The pick is decisive when its range lies wholly
  before the runner-up's.

  Args:
    runs: ``{label: [History per seed]}``, at least one candidate.
    metric, target, time_budget, chance: see :func:`estimate`.

  Returns:
    An :class:`Advice`.

  Example:
    >>> import numpy as np, jaxsync
    >>> def curve(speed):  # accuracy rising with simulated time, as a short run records it
    ...   t = np.linspace(0, 10, 11)
    ...   return jaxsync.sim.History(*([np.zeros(10)] * 9), eval_time=t, eval_version=(t * 10).astype(int),
    ...     eval_event=(t * 10).astype(int), eval_metrics={"accuracy": 1 - 0.9 / (1 + speed * t)},
    ...     worker_steps=np.zeros(4), worker_used=np.zeros(4), worker_idle=np.zeros(4),
    ...     bytes_moved=0.0, bytes_moved_intra=0.0, rejected_count=0)
    >>> advice = jaxsync.sim.rank({"fast": [curve(2.0)], "slow": [curve(0.5)]}, target=0.8)
    >>> advice.recommended, advice.decisive
    ('fast', True)
  """
  if not runs:
    raise ValueError(f"{_WHAT}: runs={{}}; expected at least one candidate's short runs.")
  estimates = [
    estimate(name, hs, metric=metric, target=target, time_budget=time_budget, chance=chance)
    for name, hs in runs.items()
  ]
  higher = _higher_is_better(metric)

  def key(e: Estimate):
    value = e.value if math.isfinite(e.value) else (-math.inf if higher else math.inf)
    quality = -value if higher else value
    return (e.seconds, quality) if target is not None else (quality,)

  ranking = tuple(sorted(estimates, key=key))
  best = ranking[0]
  tied = tuple(e.strategy for e in ranking[1:] if _overlaps(best, e, target is not None, higher))
  return Advice(
    ranking=ranking,
    metric=metric,
    target=target,
    time_budget=time_budget,
    recommended=best.strategy,
    decisive=not tied,
    tied=tied,
    reason=_reason(ranking, tied, metric, target, time_budget),
    clock=next(iter(runs.values()))[0].clock,
  )


def _overlaps(best: Estimate, other: Estimate, target_mode: bool, higher: bool) -> bool:
  """Whether ``other``'s range reaches ``best``'s: the seeds cannot tell them apart."""
  if target_mode:
    if not math.isfinite(best.seconds):
      return not math.isfinite(other.seconds)
    return other.seconds_range[0] <= best.seconds_range[1]
  if higher:
    return other.value_range[1] >= best.value_range[0]
  return other.value_range[0] <= best.value_range[1]


def _reason(
  ranking: Sequence[Estimate], tied: Sequence[str], metric: str, target: float | None, budget: float | None
) -> str:
  best = ranking[0]
  runner = ranking[1] if len(ranking) > 1 else None
  if target is not None and not math.isfinite(best.seconds):
    return (
      f"No candidate is expected to reach {_shown(metric)} {target:g}: none reached it in the short runs and "
      "none is improving fast enough to. Lower the target, or run longer (a larger fraction)."
    )
  if target is not None:
    how = "measured in the short runs" if best.reach <= 1 else f"extrapolated {best.reach:.1f}x beyond them"
    text = f"{best.strategy} reaches {_shown(metric)} {target:g} in an estimated {best.seconds:.3g} s ({how})"
    if runner is not None:
      faster = (
        f"{runner.seconds / best.seconds:.2f}x sooner than" if math.isfinite(runner.seconds) else "while not"
      )
      text += f", {faster} {runner.strategy}, the runner-up"
  else:
    text = f"{best.strategy} has the best {_shown(metric)} at {budget:g} s: {best.value:.4g}"
    if runner is not None:
      text += f", against {runner.value:.4g} for {runner.strategy}, the runner-up"
  text += "."
  if tied:
    text += (
      f" Not decisive: over the seeds its range overlaps {', '.join(tied)}'s; run more seeds or a larger "
      "fraction before choosing between them."
    )
  elif best.reach > 3:
    text += " Its estimate reaches far beyond the short runs: check it with a longer run."
  coarse = [e.strategy for e in ranking if e.run_updates < FEW_UPDATES]
  if coarse:
    text += (
      f" {', '.join(coarse)} made fewer than {FEW_UPDATES} server updates in {'its' if len(coarse) == 1 else 'their'}"
      " short runs (DiLoCo-style rounds of many local steps, or a short run), too few to estimate from;"
      " give them a larger fraction before trusting their rank."
    )
  return text


def short_run(
  strategy: Strategy,
  loss_fn: Callable[[optax.Params, Any], Any],
  data: WorkerData,
  time_model: TimeModel,
  params: optax.Params,
  *,
  eval_fn: Callable[[optax.Params], dict[str, Any]],
  gradients: int,
  seed: int = 0,
  evaluations: int = 12,
) -> History:
  """The first ``gradients`` worker gradients of a run, evaluated ``evaluations`` times at equal event counts.

  Every candidate gets the same gradients (and so the same cost to simulate);
  a synchronous round counts all its workers' gradients. The evaluations
  count events, not server updates, so a strategy whose updates combine many
  arrivals (adaptive k) gets as many points as one that updates per arrival.

  Args:
    strategy, loss_fn, data, time_model, params: as for :class:`Simulator`.
    eval_fn: ``params -> {metric: value}`` on held-out data.
    gradients: worker gradients to compute (rounded up to whole rounds).
    seed: the jitter seed.
    evaluations: evaluation points after the initial one, at least 2.

  Returns:
    The run's :class:`History`, its evaluation rows at equal event counts.
  """
  sim = Simulator(strategy, loss_fn, data, time_model)
  return _short_run(sim, _compiled(eval_fn), params, gradients=gradients, seed=seed, evaluations=evaluations)


def _compiled(eval_fn: Callable[[optax.Params], dict[str, Any]]) -> Callable[[optax.Params], dict[str, Any]]:
  """``eval_fn`` compiled once, its arrays (e.g. ``classification_metrics``' test set) arguments, not constants."""
  schedule = EvalSchedule(eval_fn, None, None)
  arrays, compiled = schedule.eval_arrays(), jax.jit(schedule.evaluate_with)
  return lambda params: compiled(arrays, params)


def _short_run(
  sim: Simulator, evaluate: Callable, params: optax.Params, *, gradients: int, seed: int, evaluations: int
) -> History:
  """:func:`short_run` on a built simulator and compiled evaluation (reused across seeds: one compile)."""
  gradients = validation.check_int(_WHAT, "gradients", gradients)
  evaluations = validation.check_int(_WHAT, "evaluations", evaluations, low=2)
  num_events = max(1, math.ceil(gradients / sim.strategy.gradients_per_event))

  def metrics(p) -> dict[str, float]:
    return {name: float(value) for name, value in evaluate(p).items()}

  state = sim.init(params, seed)
  points = [(0.0, 0, 0, metrics(params))]
  records, done, per_point = [], 0, max(1, math.ceil(num_events / evaluations))
  while done < num_events:
    state, record = sim.advance(state, min(per_point, num_events - done))
    records.append(record)
    done += len(record.time)
    points.append((float(record.time[-1]), int(record.version[-1]), done, metrics(state.params)))
  history = sim.history(records, state)
  names = sorted(points[0][3])
  return dataclasses.replace(
    history,
    eval_time=np.asarray([p[0] for p in points]),
    eval_version=np.asarray([p[1] for p in points]),
    eval_event=np.asarray([p[2] for p in points]),
    eval_metrics={name: np.asarray([p[3][name] for p in points]) for name in names},
  )


def prefix(history: History, num_events: int) -> History:
  """The first ``num_events`` events of a run and the evaluations among them: what a shorter run shows.

  Of a :func:`short_run` with ``evaluations`` points, the prefix at a whole
  number of its evaluation intervals equals the shorter short run itself
  (the simulator is deterministic and chunked runs equal one call), so one
  long run yields the advisor's view at several lengths. The per-run totals
  (gradients per worker, idle time, bytes) are not known for a prefix: they
  are left empty (``nan`` bytes).
  """
  num_events = validation.check_int(_WHAT, "num_events", num_events)
  n = min(num_events, len(history.time))
  keep = np.asarray(history.eval_event) <= n
  per_event = {
    f: getattr(history, f)[:n]
    for f in ("time", "worker", "staleness", "version", "released", "k", "loss", "rejected", "step_size")
  }
  return dataclasses.replace(
    history,
    **per_event,
    eval_time=history.eval_time[keep],
    eval_version=history.eval_version[keep],
    eval_event=history.eval_event[keep],
    eval_metrics={k: v[keep] for k, v in history.eval_metrics.items()},
    worker_steps=np.zeros(0),
    worker_used=np.zeros(0),
    worker_idle=np.zeros(0),
    bytes_moved=math.nan,
    bytes_moved_intra=math.nan,
    rejected_count=int(np.asarray(per_event["rejected"]).sum()),
  )


def advise(
  strategies: Sequence[Strategy] | Mapping[str, Strategy],
  loss_fn: Callable[[optax.Params, Any], Any],
  data: WorkerData,
  time_model: TimeModel,
  params: optax.Params,
  *,
  eval_fn: Callable[[optax.Params], dict[str, Any]],
  gradients: int,
  metric: str = "accuracy",
  target: float | None = None,
  time_budget: float | None = None,
  seeds: Sequence[int] = (0, 1),
  evaluations: int = 12,
  chance: float | None = None,
  progress: Callable[[str], None] | None = None,
) -> Advice:
  """Runs each candidate briefly on the same model, data and cluster, and says which to use.

  Each candidate runs its first ``gradients`` gradients once per jitter
  ``seed``; :func:`rank` reads the target (or the metric at a time budget)
  off those short runs, or extrapolates it, and picks one.

  Args:
    strategies: the candidates (labels are their names), or ``{label: strategy}``.
    loss_fn, data, time_model, params: as for :class:`Simulator`.
    eval_fn: ``params -> {metric: value}`` on held-out data.
    gradients: worker gradients per short run (a fraction of the planned run).
    metric, target, time_budget, chance: see :func:`estimate`.
    seeds: the cluster's jitter seeds (to vary initialisation and data
      order too, run :func:`short_run` per setup and call :func:`rank`).
    evaluations: evaluations per short run (the points of the fit).
    progress: called with one line per finished short run.

  Returns:
    An :class:`Advice`.

  Example:
    >>> import jax.numpy as jnp, numpy as np, jaxsync
    >>> x = np.linspace(-1, 1, 256, dtype=np.float32)
    >>> data = jaxsync.sim.WorkerData({"x": x, "y": 3 * x}, num_workers=4, batch_size=8)
    >>> loss = lambda w, b: jnp.mean((w * b["x"] - b["y"]) ** 2)
    >>> cluster = jaxsync.sim.TimeModel(num_workers=4, slow_fraction=0.25, slowdown=8.0)
    >>> advice = jaxsync.sim.advise(
    ...   [jaxsync.strategies.make(n, 4, learning_rate=0.1) for n in ("asp", "bsp")], loss, data, cluster,
    ...   jnp.zeros([]), eval_fn=lambda w: {"loss": loss(w, data.arrays)}, gradients=200, metric="loss",
    ...   target=1e-3, seeds=(0,))
    >>> advice.recommended  # a worker 8x slower holds every synchronous round back
    'asp'
  """
  named = dict(strategies) if isinstance(strategies, Mapping) else {s.name: s for s in strategies}
  if len(named) != len(strategies):
    raise ValueError(f"{_WHAT}: two candidates share a name; pass {{label: strategy}} to tell them apart.")
  if not seeds:
    raise ValueError(f"{_WHAT}: {seeds=}; expected at least one seed.")
  runs: dict[str, list[History]] = {}
  evaluate = _compiled(eval_fn)
  for label, strategy in named.items():
    runs[label] = []
    sim = Simulator(strategy, loss_fn, data, time_model)  # one per candidate: its seeds share the compile
    for seed in seeds:
      history = _short_run(sim, evaluate, params, gradients=gradients, seed=seed, evaluations=evaluations)
      runs[label].append(history)
      if progress is not None:
        progress(f"{label} seed {seed}: {history.updates} updates in {history.elapsed:.3g} {history.clock} s")
  return rank(runs, metric=metric, target=target, time_budget=time_budget, chance=chance)
