"""The Results page's summary of the verdicts decided on the results stores, written from the benchmarks' own files.

Each paper benchmark that records its verdicts (``Benchmark.verdict``) writes
``benchmarks/results/<name>_verdicts.json`` beside its results file: per claim, the verdict, the one number it
turns on, the evidence, the budget, the seeds per cell, the tuned learning rates and the verdict at half the
budget. This script writes one summary row per claim (paper, claim, verdict, that number, a link to the
results file, whose verdict table holds the rest) into ``docs/results.md`` between
``<!-- verdicts: generated -->`` and ``<!-- /verdicts: generated -->``; ``tests/test_docs.py`` fails when the
page and the files differ, so the table never quotes a number its results file does not hold. It also draws
``benchmarks/results/verdict_effects.png``, shown under the table: every comparison each verdict rests on
(``comparisons`` in the verdict files), its effect in points or as a speed-up, marked by its significance.

Run: ``python -m benchmarks.pages.results_page`` (after a benchmark's run or ``--report-only``).
"""

from __future__ import annotations

import json
import math
import pathlib
import re
import sys
from typing import NamedTuple

REPO = pathlib.Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
PAGE = REPO / "docs" / "results.md"
FIGURE = RESULTS / "verdict_effects.png"
MARKED = re.compile(r"(<!-- verdicts: generated -->\n)(.*?)(<!-- /verdicts: generated -->)", re.S)
# Marks a verdict whose learning rates were picked on the test set (``tuned_on`` in its verdicts file).
ON_TEST_SET = "†"
# Marks a budget-sensitive verdict (``budget_sensitive``): a symbol, not words, keeps each row to two lines.
BUDGET_SENSITIVE = "½"
HEADER = (
  "| paper | claim | verdict | the number it turns on | |",
  "|---|---|---|---|---|",
)


def rows(results: pathlib.Path = RESULTS) -> list[str]:
  """One summary row per recorded verdict, grouped by paper in the order the benchmarks (sorted by name) first
  name it, so a paper's claims on a second workload (the language model's) sit under its first: the paper
  (once per paper), the claim, the verdict (budget-sensitive ones marked), the one number it turns on, and a
  link to the results file whose verdict table holds the evidence, the budget, the seeds and the tuned rates."""
  by_paper: dict[str, list[list[str]]] = {}
  for path in _verdict_files(results):
    name = path.name.removesuffix("_verdicts.json")
    for v in json.loads(path.read_text()):
      verdict = (
        _short(v["verdict"])
        + (f" {BUDGET_SENSITIVE}" if v.get("budget_sensitive") else "")
        + (f" {ON_TEST_SET}" if v.get("tuned_on") == "test set" else "")
      )
      cells = [v["claim"], verdict, v.get("decides") or "-", f"[results](../benchmarks/results/{name}.md)"]
      by_paper.setdefault(v["paper"], []).append(cells)
  return [
    "| " + " | ".join(c.replace("|", "/") for c in [paper if i == 0 else "", *cells]) + " |"
    for paper, claims in by_paper.items()
    for i, cells in enumerate(claims)
  ]


def _verdict_files(results: pathlib.Path) -> list[pathlib.Path]:
  """The benchmarks' verdict files, by benchmark name (``low_communication`` before ``low_communication_lm``)."""
  return sorted(results.glob("*_verdicts.json"), key=lambda p: p.name.removesuffix("_verdicts.json"))


def _short(verdict: str) -> str:
  """A verdict's words without the parenthetical that follows its bold word: "**partly** (sync wins at ...)" is
  "**partly**" here (its results file keeps the whole)."""
  head, parenthetical, _ = verdict.partition("** (")
  return head + "**" if verdict.startswith("**") and parenthetical else verdict


class Effect(NamedTuple):
  """One comparison a verdict rests on, as the summary figure draws it."""

  row: str  # the claim, with its paper
  unit: str  # "points" (accuracy) or "speed-up" (a log ratio of times)
  effect: float  # signed: positive is the claim's way; a speed-up as its log
  p: float | None  # after Holm where the claim corrects; None: not tested
  se: float | None = None  # its standard error (the same unit), where it has one


def effects(results: pathlib.Path = RESULTS) -> list[Effect]:
  """Every measured comparison of every recorded verdict (``comparisons`` in ``<name>_verdicts.json``)."""
  out = []
  for path in _verdict_files(results):
    for v in json.loads(path.read_text()):
      row = f"{v['paper'].split(' (')[0]}: {v['claim']}"
      for c in v.get("comparisons", []):
        if c["effect"] is None:
          continue
        unit = "speed-up" if "(log" in c["label"] else "points"
        se = c.get("se")
        out.append(Effect(row, unit, float(c["effect"]), c["p"], None if se is None else float(se)))
  return out


def figure(results: pathlib.Path = RESULTS, out: pathlib.Path = FIGURE) -> pathlib.Path | None:
  """Each claim's comparisons, one row per claim: accuracy differences in points on the left, speed-ups on
  the right (log scale), each with its 95% interval (1.96 standard errors) where it has one; filled where
  significant (p < 0.05 after Holm), hollow where not, grey where untested. None when no verdict records a
  comparison."""
  found = effects(results)
  if not found:
    return None
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib import ticker

  rows = list(dict.fromkeys(e.row for e in found))
  fig, axes = plt.subplots(1, 2, figsize=(11, 0.32 * len(rows) + 1.2), sharey=True)
  for ax, unit in zip(axes, ("points", "speed-up")):
    for e in (e for e in found if e.unit == unit):
      y = rows.index(e.row)
      x = math.exp(e.effect) if unit == "speed-up" else e.effect
      significant = e.p is not None and e.p < 0.05
      colour = "tab:blue" if e.effect > 0 else "tab:red"
      if e.se is not None:  # the effect's 95% interval (a speed-up's on its log)
        low, high = e.effect - 1.96 * e.se, e.effect + 1.96 * e.se
        ends = (math.exp(low), math.exp(high)) if unit == "speed-up" else (low, high)
        ax.plot(ends, (y, y), "-", color=colour, lw=1, alpha=0.5)
      if e.p is None:
        ax.plot(x, y, "x", color="grey", ms=5)
      else:
        ax.plot(x, y, "o", ms=6, mfc=colour if significant else "none", mec=colour, alpha=0.85)
    ax.axvline(1.0 if unit == "speed-up" else 0.0, color="black", lw=0.8)
    if unit == "speed-up":
      ax.set_xscale("log")
      ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
      ax.xaxis.set_minor_formatter(ticker.NullFormatter())
      ax.set_xticks([0.25, 0.5, 1.0, 2.0, 4.0])
      ax.set_xlabel("speed-up (> 1x: the claim's way)")
    else:
      ax.set_xlabel("accuracy difference, points (> 0: the claim's way)")
    ax.grid(axis="x", alpha=0.3)
  axes[0].set_yticks(range(len(rows)), [r if len(r) <= 60 else r[:57] + "..." for r in rows], fontsize=7)
  axes[0].invert_yaxis()
  fig.suptitle(
    "Every comparison the verdicts rest on, its 95% interval uncorrected: filled = significant (p < 0.05 after Holm),"
    " hollow = not; blue = the claim's way, red = against it",
    fontsize=8,
  )
  fig.tight_layout()
  out.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(out, dpi=110)
  plt.close(fig)
  return out


def block(results: pathlib.Path = RESULTS) -> str:
  """What belongs between the page's markers."""
  found = rows(results)
  if not found:
    return "No benchmark has recorded its verdicts on a results store yet.\n"
  notes = []
  if any(f" {BUDGET_SENSITIVE}" in row for row in found):
    notes.append(
      f"{BUDGET_SENSITIVE} Budget-sensitive: at half the budget, with the same picks, the verdict's word or a"
      " comparison it rests on differs in sign or significance (its results file lists each change)."
    )
  if any(ON_TEST_SET in row for row in found):
    notes.append(
      f"{ON_TEST_SET} Learning rates picked on the test set (the protocol before validation splits); the grids"
      " are being rerun on a validation split, and a verdict whose picks move will be decided again."
    )
  return "\n".join([*HEADER, *found, *(["", " ".join(notes)] if notes else [])]) + "\n"


def main(argv: list[str] | None = None) -> int:
  del argv
  page = PAGE.read_text()
  if not MARKED.search(page):
    raise SystemExit(f"{PAGE}: no '<!-- verdicts: generated -->' ... '<!-- /verdicts: generated -->' markers")
  PAGE.write_text(MARKED.sub(lambda m: m.group(1) + block() + m.group(3), page))
  drawn = figure()
  print(
    f"[results_page] wrote {len(rows())} verdicts into {PAGE}"
    + (f" and {len(effects())} comparisons into {drawn}" if drawn else ""),
    file=sys.stderr,
  )
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
