"""A paper claim's verdict as data: the comparisons it rests on, the one number it turns on, and whether it is
budget-sensitive (its word, or a comparison's sign or significance, differs at half the budget).

The claims build these (``harness.Comparison``, ``harness.Verdict``...: the harness re-exports them);
``harness.Benchmark.decided`` turns a claim's full- and half-budget answers into a :class:`Verdict`, whose
record the Results page (``benchmarks/pages/results_page.py``) reads from ``<name>_verdicts.json``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple


class Comparison(NamedTuple):
  """One comparison a verdict rests on: ``effect`` signed (positive: the claim's way; None: not measured),
  ``p`` its p-value as the claim judges it (after Holm where the claim corrects; None: not tested) and ``se``
  the effect's standard error where it has one (the Results page's figure draws ``effect ± 1.96 se``)."""

  label: str
  effect: float | None
  p: float | None = None
  se: float | None = None

  @property
  def significant(self) -> bool | None:
    return None if self.p is None or self.p != self.p else self.p < 0.05

  def text(self) -> str:
    effect = "-" if self.effect is None else f"{self.effect:+.3g}"
    return effect + ("" if self.significant is None else f" (p = {self.p:.3f})")


class Comparisons(tuple):
  """The comparisons a claim's verdict rests on (:class:`Comparison`), carried among what it rests on as
  :class:`Deciding` is: a verdict whose comparison changes sign or significance between the half and the full
  budget is budget-sensitive, even where its word does not change."""


def finite_record(record: dict) -> dict:
  """A comparison as JSON holds it: NaN (not measured, not tested) as None."""
  return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}


def evidence_changes(full: Comparisons | None, half: Comparisons | None) -> list[str]:
  """The comparisons present at both budgets whose sign or significance differs, in words."""
  if not full or not half:
    return []
  at_half = {c.label: c for c in half}
  changed = []
  for c in full:
    h = at_half.get(c.label)
    if h is None:
      continue
    # A sign only where both effects were measured and are not zero (NaN: a side with no value).
    signs = [None if e is None or not math.isfinite(e) or e == 0 else e > 0 for e in (c.effect, h.effect)]
    sign = None not in signs and signs[0] != signs[1]
    significance = c.significant is not None and h.significant is not None and c.significant != h.significant
    if sign or significance:
      what = {(True, False): "sign", (False, True): "significance"}.get(
        (sign, significance), "sign and significance"
      )
      changed.append(f"{c.label}: {c.text()} at the full budget, {h.text()} at half ({what})")
  return changed


def match_word(shown: int, missed: int, total: int, *, yes: str = "holds", no: str = "does not hold") -> str:
  """The word of a claim that ours matches theirs within a margin, over ``total`` comparisons: ``yes`` where
  every one shows it significantly (``shown``: a non-inferiority or equivalence test, after Holm), ``no`` where
  every mean misses the margin (``missed``), "partly" otherwise."""
  return f"**{no}**" if missed == total else f"**{yes}**" if shown == total else "**partly**"


class Deciding(str):
  """The one number a claim's verdict turns on, in words (e.g. "0.89x ASP at 10 Gbit/s, p = 0.667 after
  Holm"): a claim's ``(verdict, evidence, ...)`` carries it among what it rests on, and the Results page's
  summary table shows it."""


@dataclasses.dataclass
class Verdict:
  """One paper claim decided: the words the Results page shows, and what they rest on.

  ``budget`` (the run's length, e.g. "10 epochs"), ``seeds`` (per cell), ``picks`` (each method's tuned
  learning rate, per column), ``at_half`` (the verdict the same cells give at half the
  budget; a different one marks the claim budget-sensitive), ``half_evidence`` (what that verdict rests
  on), ``decides`` (:class:`Deciding`: the one number it turns on) and ``evidence_changes`` (the comparisons
  of :class:`Comparisons` whose sign or significance differs at half the budget); ``comparisons`` (each
  comparison at the full budget as ``{"label", "effect", "p"}``: the Results page's figure draws them)."""

  paper: str
  claim: str
  verdict: str
  evidence: str
  budget: str
  seeds: str
  picks: str
  at_half: str | None = None
  half_evidence: str | None = None
  decides: str | None = None
  evidence_changes: list[str] = dataclasses.field(default_factory=list)
  comparisons: list[dict] = dataclasses.field(default_factory=list)

  @property
  def word_changes(self) -> bool:
    return self.at_half is not None and self.at_half != self.verdict

  @property
  def budget_sensitive(self) -> bool:
    """The verdict's word differs at half the budget, or a comparison it rests on changes sign or significance."""
    return self.word_changes or bool(self.evidence_changes)
