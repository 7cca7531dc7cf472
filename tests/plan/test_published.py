"""The planner's figures in the README and the docs are the results files', and the files are what the code writes."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re

import pytest

from benchmarks.calibration import plan_vs_published
from jaxsync._src.app import plan_config

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
COUNT = re.compile(r"Cells within one step of the published value: (\d+) of (\d+)")
BELOW = re.compile(r"(\d+) of (\d+) (?:cells within one step|reading each published cell)")


def _counts(text: str) -> tuple:
  return COUNT.search(" ".join(text.split())).groups(), BELOW.search(" ".join(text.split())).groups()


def test_the_readme_and_the_results_page_quote_the_counts_of_the_results_file():
  committed = _counts((RESULTS / "plan_vs_published.md").read_text())
  for page in (ROOT / "README.md", ROOT / "docs" / "results.md"):
    assert _counts(page.read_text()) == committed, page.name


def test_the_counts_of_the_results_file_are_its_cells():
  cells = json.loads((RESULTS / "plan_vs_published.json").read_text())
  text = plan_vs_published.report(cells, 0.0)
  assert _counts(text) == _counts((RESULTS / "plan_vs_published.md").read_text())
  assert len(cells) == 174 and sum(c["agrees"] for c in cells) == int(COUNT.search(text).group(1))


def test_the_tiny_run_recomputes_the_committed_cells(tmp_path):
  assert plan_vs_published.main(["--tiny", "--out", str(tmp_path)]) == 0
  fresh = json.loads((tmp_path / "plan_vs_published_tiny.json").read_text())
  committed = {
    (c["table"], c["model"], c["method"]): c
    for c in json.loads((RESULTS / "plan_vs_published.json").read_text())
  }
  assert len(fresh) == 9
  for cell in fresh:
    saved = committed[(cell["table"], cell["model"], cell["method"])]
    assert cell["ours"] == pytest.approx(saved["ours"], rel=1e-9) and cell["agrees"] == saved["agrees"]


@pytest.mark.parametrize("gbps", [1, 10])
def test_the_worked_example_is_what_the_config_plans(gbps):
  config = plan_config.load_plan(
    ROOT / "configs" / "plan" / "four_datacenters.yaml", [f"topology.outer.gbps={gbps}"]
  )
  fresh = json.loads(json.dumps(dataclasses.asdict(plan_config.run_plan(config)), default=str))
  saved = json.loads((RESULTS / "plan_four_datacenters" / f"{gbps}gbps" / "plan.json").read_text())
  assert len(fresh["strategies"]) == len(saved["strategies"]) == 6
  assert _close(fresh, saved)


def _close(a, b) -> bool:
  """Every number of ``a`` within 1e-6 of ``b``'s, everything else equal."""
  if isinstance(a, dict):
    assert a.keys() == b.keys()
    return all(_close(a[k], b[k]) for k in a)
  if isinstance(a, list):
    assert len(a) == len(b)
    return all(_close(x, y) for x, y in zip(a, b))
  if isinstance(a, float) and isinstance(b, float):
    assert a == pytest.approx(b, rel=1e-6)
    return True
  assert a == b
  return True


def test_every_number_of_the_worked_example_is_in_its_tables():
  page = (ROOT / "docs" / "guide" / "planning.md").read_text()
  paragraph = page[
    page.index("<!-- planning-example:start -->") : page.index("<!-- planning-example:end -->")
  ]
  tables = " ".join(
    (RESULTS / "plan_four_datacenters" / f"{g}gbps" / "plan.md").read_text() for g in ("1", "10")
  )
  # The config's own inputs (the model, the link, the budget) are not results.
  inputs = {"0.59", "50", "80", "90", "95", "100", "200"}
  numbers = set(re.findall(r"\d+(?:\.\d+)?", paragraph)) - inputs
  missing = sorted(n for n in numbers if not re.search(rf"(?<![\d.]){re.escape(n)}(?![\d])", tables))
  assert not missing, missing
