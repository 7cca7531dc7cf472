"""The Results page's summary of the verdicts decided on the results stores, written from the benchmarks' own files.

Each paper benchmark that records its verdicts (``Benchmark.verdict``) writes
``benchmarks/results/<name>_verdicts.json`` beside its results file: per claim, the verdict, the one number it
turns on, the evidence, the budget, the seeds per cell, the tuned learning rates and the verdict at half the
budget. This script writes one summary row per claim (paper, claim, verdict, that number, a link to the
results file, whose verdict table holds the rest) into ``docs/results.md`` between
``<!-- verdicts: generated -->`` and ``<!-- /verdicts: generated -->``; ``tests/test_docs.py`` fails when the
page and the files differ, so the table never quotes a number its results file does not hold.

Run: ``python -m benchmarks.pages.results_page`` (after a benchmark's run or ``--report-only``).
"""

from __future__ import annotations

import json
import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
PAGE = REPO / "docs" / "results.md"
MARKED = re.compile(r"(<!-- verdicts: generated -->\n)(.*?)(<!-- /verdicts: generated -->)", re.S)
# Marks a verdict whose learning rates were picked on the test set (``tuned_on`` in its verdicts file).
ON_TEST_SET = "†"
HEADER = (
  "| paper | claim | verdict | the number it turns on | |",
  "|---|---|---|---|---|",
)


def rows(results: pathlib.Path = RESULTS) -> list[str]:
  """One summary row per recorded verdict, benchmark by benchmark (sorted by file name): the paper (once per
  paper), the claim, the verdict (budget-sensitive ones marked), the one number it turns on, and a link to
  the results file whose verdict table holds the evidence, the budget, the seeds and the tuned rates."""
  out, last_paper = [], None
  for path in sorted(results.glob("*_verdicts.json")):
    name = path.name.removesuffix("_verdicts.json")
    for v in json.loads(path.read_text()):
      verdict = (
        _short(v["verdict"])
        + (" (budget-sensitive)" if v.get("budget_sensitive") else "")
        + (f" {ON_TEST_SET}" if v.get("tuned_on") == "test set" else "")
      )
      cells = [
        "" if v["paper"] == last_paper else v["paper"],
        v["claim"],
        verdict,
        v.get("decides") or "-",
        f"[results](../benchmarks/results/{name}.md)",
      ]
      last_paper = v["paper"]
      out.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
  return out


def _short(verdict: str) -> str:
  """A verdict's words without the parenthetical that follows its bold word: "**partly** (sync wins at ...)" is
  "**partly**" here (its results file keeps the whole)."""
  head, parenthetical, _ = verdict.partition("** (")
  return head + "**" if verdict.startswith("**") and parenthetical else verdict


def block(results: pathlib.Path = RESULTS) -> str:
  """What belongs between the page's markers."""
  found = rows(results)
  if not found:
    return "No benchmark has recorded its verdicts on a results store yet.\n"
  note = (
    [
      "",
      f"{ON_TEST_SET} Learning rates picked on the test set (the protocol before validation splits); the grids"
      " are being rerun on a validation split, and a verdict whose picks move will be decided again.",
    ]
    if any(ON_TEST_SET in row for row in found)
    else []
  )
  return "\n".join([*HEADER, *found, *note]) + "\n"


def main(argv: list[str] | None = None) -> int:
  del argv
  page = PAGE.read_text()
  if not MARKED.search(page):
    raise SystemExit(f"{PAGE}: no '<!-- verdicts: generated -->' ... '<!-- /verdicts: generated -->' markers")
  PAGE.write_text(MARKED.sub(lambda m: m.group(1) + block() + m.group(3), page))
  print(f"[results_page] wrote {len(rows())} verdicts into {PAGE}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
