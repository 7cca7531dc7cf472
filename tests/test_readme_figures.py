"""The README's figures are the measured ones: its marked paragraphs are what benchmarks/pages/readme_figures.py
writes from the committed results file, and the configs quote no figure of their own."""

from __future__ import annotations

import importlib
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
readme_figures = importlib.import_module("benchmarks.pages.readme_figures")
RESULTS = json.loads((ROOT / "benchmarks" / "results" / "readme_figures.json").read_text())


def test_the_readme_quotes_the_results_file():
  readme = (ROOT / "README.md").read_text()
  marked = {m[2]: m[3] for m in readme_figures.MARKED.finditer(readme)}
  assert set(marked) == {"quickstart", "fashion_mnist"}
  assert marked == readme_figures.paragraphs(RESULTS)


def test_the_results_file_measured_every_command_on_the_code_of_a_commit():
  assert set(RESULTS) == set(readme_figures.COMMANDS)
  for name, entry in RESULTS.items():
    assert entry["command"] == "jaxsync train " + " ".join(readme_figures.COMMANDS[name])
    assert not entry["code"].endswith("+changes"), f"{name} was measured on uncommitted code"


def test_a_changed_figure_is_caught():
  changed = json.loads(json.dumps(RESULTS))
  changed["quickstart"]["final_accuracy"] -= 0.01
  assert readme_figures.paragraphs(changed)["quickstart"] != readme_figures.paragraphs(RESULTS)["quickstart"]
  loaded = json.loads(json.dumps(RESULTS))
  loaded["fashion_mnist"]["load_before"] = 1.7
  assert "(a machine with load 1.7)" in readme_figures.paragraphs(loaded)["fashion_mnist"].replace("\n", " ")


def test_the_configs_quote_no_figure_the_results_file_does_not_hold():
  for config in ("quickstart.yaml", "fashion_mnist.yaml"):
    text = (ROOT / "configs" / config).read_text()
    assert "test accuracy" not in text and " s on 2 CPU cores" not in text, config
