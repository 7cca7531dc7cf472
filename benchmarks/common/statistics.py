"""The statistics the verdicts use: Welch's t-test, a test of growth between two settings, an exact rank test
for times where a seed missed the target, the test of two times to a target (never deciding inside an
evaluation interval), a speed-up's standard error, and Holm's correction for a family of tests."""

from __future__ import annotations

import itertools
import math

import numpy as np


def welch(a: list[float | None], b: list[float | None], *, margin: float | None = None) -> dict[str, float]:
  """Mean difference ``a - b``, its standard error and Welch's two-sided p over each side's finite values
  (unpaired; NaN where either has fewer than 2, or where neither varies: no spread to test against).

  ``margin``: instead, the one-sided p of a non-inferiority test, against ``a - b <= -margin`` (a small p:
  ``a`` is significantly less than ``margin`` behind ``b``), Welch's t of ``(a - b + margin) / se``."""
  from scipy import stats

  x = np.asarray([v for v in a if v is not None and np.isfinite(v)], float)
  y = np.asarray([v for v in b if v is not None and np.isfinite(v)], float)
  if len(x) < 2 or len(y) < 2:
    diff = float(x.mean() - y.mean()) if len(x) and len(y) else float("nan")
    return {"diff": diff, "se": float("nan"), "p": float("nan")}
  se = float(np.sqrt(x.var(ddof=1) / len(x) + y.var(ddof=1) / len(y)))
  if se == 0:
    p = float("nan")
  elif margin is None:
    p = float(stats.ttest_ind(x, y, equal_var=False).pvalue)
  else:
    p = float(stats.ttest_ind(x + margin, y, equal_var=False, alternative="greater").pvalue)
  return {"diff": float(x.mean() - y.mean()), "se": se, "p": p}


def growth_test(a1, b1, a2, b2) -> dict[str, float]:
  """Does the gap ``a - b`` grow from setting 1 to 2: ``(mean a2 - mean b2) - (mean a1 - mean b1)``, its
  standard error and the two-sided p of Welch's t for this combination of four independent means (the
  Welch-Satterthwaite degrees of freedom). NaN where a side has fewer than 2 finite values or none varies."""
  from scipy import stats

  sides = [np.asarray([v for v in s if v is not None and np.isfinite(v)], float) for s in (a1, b1, a2, b2)]
  if any(len(x) < 2 for x in sides):
    return {"diff": float("nan"), "se": float("nan"), "p": float("nan")}
  x1, y1, x2, y2 = sides
  diff = float((x2.mean() - y2.mean()) - (x1.mean() - y1.mean()))
  parts = np.asarray([x.var(ddof=1) / len(x) for x in sides])
  se = float(np.sqrt(parts.sum()))
  if se == 0:
    return {"diff": diff, "se": se, "p": float("nan")}
  df = parts.sum() ** 2 / sum(v**2 / (len(x) - 1) for v, x in zip(parts, sides) if v > 0)
  return {"diff": diff, "se": se, "p": float(2 * stats.t.sf(abs(diff) / se, df))}


def rank_test(a: list[float | None], b: list[float | None]) -> float:
  """Two-sided p of an exact permutation test on the rank sum of ``a`` against ``b`` (Mann-Whitney, ties
  at their mean rank), a missing value (None, NaN: the target never reached) counted as slower than every
  time. For times to a target where some seed missed it, which Welch's test cannot take; NaN when a side
  is empty. With 3 seeds a side its smallest p is 0.1: it separates only with more seeds."""
  from scipy import stats

  x = [np.inf if v is None or not np.isfinite(v) else float(v) for v in a]
  y = [np.inf if v is None or not np.isfinite(v) else float(v) for v in b]
  if not x or not y:
    return float("nan")
  ranks = stats.rankdata(x + y)
  expected = len(x) * (len(ranks) + 1) / 2
  observed = abs(ranks[: len(x)].sum() - expected)
  sums = [ranks[list(c)].sum() for c in itertools.combinations(range(len(ranks)), len(x))]
  return float(np.mean([abs(t - expected) >= observed - 1e-9 for t in sums]))


def time_test(
  a: list[float | None], b: list[float | None], *, within: float | None = None
) -> dict[str, float | str]:
  """Times to a target of two cells compared over the seeds: Welch's p when every seed of both reached it,
  else the rank test with a miss as the slowest (``rank_test``). ``{"p", "test"}``.

  ``within``: how far from its evaluation a crossing may lie (``crossing_width``): where every seed reached
  the target and the means differ by no more, the comparison is not decided (p = 1): an evaluation
  interval, not the methods, could make the difference."""
  if all(v is not None and np.isfinite(v) for v in [*a, *b]):
    gap = abs(float(np.mean(a)) - float(np.mean(b))) if a and b else math.inf
    if within is not None and gap <= within:
      return {"p": 1.0, "test": f"within one evaluation interval ({within:.3g} s): not decided"}
    return {"p": welch(a, b)["p"], "test": "Welch"}
  return {"p": rank_test(a, b), "test": "rank test, a miss as the slowest"}


def log_ratio_se(a: list[float | None], b: list[float | None]) -> float | None:
  """The standard error of ``log(mean b / mean a)`` by the delta method, ``sqrt(s_a^2 / (n_a m_a^2) + s_b^2 /
  (n_b m_b^2))``; None unless every value of both sides is finite (a missed target) and each has two."""
  sides = [np.asarray([np.nan if v is None else v for v in s], float) for s in (a, b)]
  if any(len(x) < 2 or not np.isfinite(x).all() or x.mean() <= 0 for x in sides):
    return None
  return float(np.sqrt(sum(x.var(ddof=1) / (len(x) * x.mean() ** 2) for x in sides)))


def holm(pvalues: list[float]) -> list[float]:
  """Holm's step-down adjustment of p-values for a family of tests (Holm, 1979).

  The i-th smallest of the m finite p-values becomes ``max_{j <= i} min(1, (m - j + 1) p_(j))``; a test
  whose adjusted p-value is below alpha is significant with the family's error rate held at alpha.
  NaN (a test that could not be made) stays NaN and does not count in m."""
  p = np.asarray(pvalues, float)
  finite = np.flatnonzero(np.isfinite(p))
  adjusted = np.full(p.shape, np.nan)
  running = 0.0
  for rank, i in enumerate(finite[np.argsort(p[finite], kind="stable")]):
    running = max(running, min(1.0, (len(finite) - rank) * p[i]))
    adjusted[i] = running
  return adjusted.tolist()
