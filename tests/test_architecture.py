"""The layers of ``jaxsync/_src``: each folder imports only from the layers below it.

The order (docs/design.md, "Layers"): ``core`` < ``rules``, ``data``, ``models``
< ``strategies`` < ``steps`` < ``interface`` < ``sim``, ``distributed`` < ``advisor``,
``calibration``, ``plan``, ``train`` < ``app``. Folders of the same rank are independent of each other (the simulator
and the multi-process runtime share only what lies below them). The public
modules (``jaxsync/*.py``) sit on top.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "jaxsync" / "_src"
RANK = {
  "core": 0,
  "rules": 1,
  "data": 1,
  "models": 1,
  "strategies": 2,
  "steps": 3,
  "interface": 4,
  "sim": 5,
  "distributed": 5,
  "advisor": 6,
  "plan": 6,
  "calibration": 6,
  "train": 6,
  "app": 7,
}
MODULES = sorted(p for p in SRC.rglob("*.py") if p.parent != SRC)


def _layer(module: str) -> str | None:
  """``jaxsync._src.LAYER.x`` -> LAYER; anything else (jax, numpy, the public facade) -> None."""
  parts = module.split(".")
  if parts[:2] != ["jaxsync", "_src"] or len(parts) < 3:
    return None
  return parts[2]


def _imports(path: pathlib.Path) -> list[tuple[int, str]]:
  """(line, module) of every jaxsync import in ``path``, local (function-level) imports included."""
  found = []
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found += [(node.lineno, alias.name) for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module:
      if node.module == "jaxsync._src":
        found += [(node.lineno, f"jaxsync._src.{alias.name}") for alias in node.names]
      else:
        found.append((node.lineno, node.module))
  return [(line, m) for line, m in found if m == "jaxsync" or m.startswith("jaxsync.")]


def test_every_folder_has_a_rank():
  folders = {p.name for p in SRC.iterdir() if p.is_dir() and not p.name.startswith("__")}
  assert folders == set(RANK), folders ^ set(RANK)
  assert [p.name for p in SRC.glob("*.py")] == ["__init__.py"], "modules belong in a layer's folder"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_a_module_imports_only_from_its_own_layer_or_below(path):
  own = path.relative_to(SRC).parts[0]
  bad = []
  for line, module in _imports(path):
    layer = _layer(module)
    if layer is None:
      bad.append(f"line {line}: {module} (the public facade; import from jaxsync._src instead)")
    elif layer != own and RANK[layer] >= RANK[own]:
      bad.append(f"line {line}: {module} ({layer}, rank {RANK[layer]} >= {own}'s {RANK[own]})")
  assert not bad, f"{path.relative_to(SRC)} imports from above or beside its layer:\n" + "\n".join(bad)


def test_the_check_itself_catches_an_upward_import(tmp_path):
  # The test above would pass vacuously if _imports missed imports: it must see these three forms.
  source = "from jaxsync._src import sim\nimport jaxsync._src.app.config\ndef f():\n  from jaxsync._src.train.plots import x\n"
  (tmp_path / "m.py").write_text(source)
  found = [m for _, m in _imports(tmp_path / "m.py")]
  assert found == ["jaxsync._src.sim", "jaxsync._src.app.config", "jaxsync._src.train.plots"]


def test_every_test_folder_is_collected(request):
  # pytest skips folders named like its norecursedirs (by default "dist" and "build"): tests/dist once
  # went uncollected that way. Every folder of tests/ must be one pytest walks into.
  import fnmatch

  skipped = request.config.getini("norecursedirs")
  folders = [
    p.name for p in pathlib.Path(__file__).parent.iterdir() if p.is_dir() and p.name != "__pycache__"
  ]
  assert not [f for f in folders if any(fnmatch.fnmatch(f, pattern) for pattern in skipped)], skipped


def test_no_library_module_outgrows_one_job():
  # A module over 700 lines has taken on a second job (the registry reached 1,025 before it was split by
  # family): split it where the jobs part.
  package = SRC.parent
  long = {
    str(p.relative_to(package)): n
    for p in package.rglob("*.py")
    if (n := len(p.read_text().splitlines())) > 700
  }
  assert not long, long
