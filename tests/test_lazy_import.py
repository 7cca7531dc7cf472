"""``import jaxsync`` and ``jaxsync --help`` load no JAX; a rule's first use loads JAX, optax and the rules
only; the submodules load on first use.

One fresh interpreter (this process has imported everything already) records ``sys.modules`` after
``import jaxsync``, after ``jaxsync --help``, after a rule's first use, and after the submodules' first use.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

import jaxsync

SUBMODULES = ("datasets", "dist", "models", "sim", "strategies")
HEAVY = ("zmq", "flax", "rich", "yaml", "grain", "orbax", "matplotlib", "sklearn", "tensorboardX")
# The layers a transform needs: the rules, and the argument checks they share.
RULES = ("jaxsync._src.core", "jaxsync._src.rules")

_SCRIPT = f"""
import contextlib, io, json, sys

def loaded():
  return sorted(sys.modules)

stages = {{}}
import jaxsync
stages["import jaxsync"] = loaded()
from jaxsync.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
  main(["--help"])
stages["jaxsync --help"] = loaded()
rule = jaxsync.ordered_momentum
stages["a rule used"] = loaded()
names = {{name: len(getattr(jaxsync, name).__all__) for name in {SUBMODULES!r}}}
stages["submodules used"] = loaded()
print(json.dumps({{"stages": stages, "names": names}}))
"""


@pytest.fixture(scope="module")
def fresh():
  out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, check=True).stdout
  return json.loads(out.splitlines()[-1])


def _packages(modules: list[str]) -> set[str]:
  return {m.split(".")[0] for m in modules}


def test_import_jaxsync_loads_no_jax(fresh):
  modules = fresh["stages"]["import jaxsync"]
  assert not _packages(modules) & {"jax", "jaxlib", "optax", "numpy", *HEAVY}, sorted(_packages(modules))
  assert [m for m in modules if m.startswith("jaxsync")] == ["jaxsync"]


def test_a_rules_first_use_loads_jax_optax_and_the_rules_only(fresh):
  modules = fresh["stages"]["a rule used"]
  assert {"jax", "optax"} <= _packages(modules)
  assert not _packages(modules) & set(HEAVY) - {"rich", "yaml"}, sorted(_packages(modules) & set(HEAVY))
  ours = [m for m in modules if m.startswith("jaxsync.") and m not in fresh["stages"]["jaxsync --help"]]
  assert ours and all(m.startswith(RULES) for m in ours), ours


def test_every_public_rule_resolves_and_is_cached():
  import jaxsync as package

  for name in [*package._RULES, *package._APP]:
    assert getattr(package, name) is getattr(package, name)
    assert name in vars(package)  # cached in the module after its first use
  assert {*package._RULES, *package._APP} <= set(package.__all__)


def test_jaxsync_help_imports_no_jax_and_no_runtime(fresh):
  modules = fresh["stages"]["jaxsync --help"]
  assert not _packages(modules) & {"jax", "jaxlib", "optax", "numpy", *HEAVY}, sorted(_packages(modules))
  assert not [
    m for m in modules if m.startswith(("jaxsync._src.app", "jaxsync._src.sim", "jaxsync._src.distributed"))
  ]


def test_the_submodules_load_on_first_use_and_work(fresh):
  assert not {f"jaxsync.{name}" for name in SUBMODULES} & set(fresh["stages"]["jaxsync --help"])
  assert {f"jaxsync.{name}" for name in SUBMODULES} <= set(fresh["stages"]["submodules used"])
  assert all(fresh["names"].values()), fresh["names"]


def test_the_package_lists_and_imports_its_submodules():
  assert set(SUBMODULES) <= set(jaxsync.__all__) and set(SUBMODULES) <= set(dir(jaxsync))
  from jaxsync import sim

  assert sim is jaxsync.sim and jaxsync.sim.Simulator
  with pytest.raises(AttributeError, match="module 'jaxsync' has no attribute 'simulator'"):
    jaxsync.simulator  # noqa: B018


@pytest.mark.heavy
def test_the_import_time_benchmark_writes_its_table(tmp_path, monkeypatch):
  import_time = importlib.import_module("benchmarks.speed.import_time")
  assert import_time.main(["--runs", "1", "--results-dir", str(tmp_path)]) == 0
  rows = [line for line in (tmp_path / "import_time.md").read_text().splitlines() if line.startswith("| `")]
  assert [row.split("`")[1] for row in rows] == [
    "python -c pass",
    "import optax",
    "import jaxsync (working tree)",
    "jaxsync --help (working tree)",
  ]
  assert rows[2].endswith("| - |") and rows[3].endswith("| - |"), rows[2:]  # no JAX, nothing heavy
