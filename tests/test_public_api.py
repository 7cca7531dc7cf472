"""The public surface: every name documented in the optax style, every example runnable."""

import doctest
import importlib
import inspect
import pkgutil
import re

import pytest

import jaxsync
import jaxsync._src

# The rules (and their helpers), each from a paper; train_config runs a config and cites none.
FUNCTIONS = [n for n in jaxsync._RULES if inspect.isfunction(getattr(jaxsync, n))]
CLASSES = [n for n in jaxsync.__all__ if inspect.isclass(getattr(jaxsync, n))]
RECONSTRUCTED = ["ordered_momentum", "adaptive_k", "bb_step_size", "scale_by_staleness"]
MODULES = [m.name for m in pkgutil.walk_packages(jaxsync._src.__path__, "jaxsync._src.") if not m.ispkg]


def test_all_is_complete_and_every_name_exists():
  assert len(set(jaxsync.__all__)) == len(jaxsync.__all__)
  for name in jaxsync.__all__:
    assert hasattr(jaxsync, name), name
  public = {n for n in vars(jaxsync) if not n.startswith("_")}
  # jaxsync.cli (the command line) is imported on demand, not by `import jaxsync`.
  assert public - set(jaxsync.__all__) - {"cli"} == set()


@pytest.mark.parametrize("name", jaxsync.__all__)
def test_every_public_name_has_a_docstring(name):
  doc = inspect.getdoc(getattr(jaxsync, name))
  assert doc and len(doc.splitlines()[0]) > 10, name


def _section(doc: str, title: str) -> str:
  """The text of a Google-style docstring section (up to the next section title)."""
  after = doc.split(f"\n{title}:\n", 1)
  if len(after) < 2:
    return ""
  return re.split(r"\n[A-Z][A-Za-z ]+:\n", after[1], maxsplit=1)[0]


@pytest.mark.parametrize("name", FUNCTIONS)
def test_functions_are_documented_in_the_optax_style(name):
  fn = getattr(jaxsync, name)
  doc = inspect.getdoc(fn)
  for section in ("Args", "Returns", "Example", "References"):
    assert _section(doc, section).strip(), f"{name} lacks a {section} section"
  assert ">>>" in _section(doc, "Example"), f"{name} has no runnable example"
  args = _section(doc, "Args")
  for parameter in inspect.signature(fn).parameters.values():
    if parameter.kind in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL):
      continue
    assert re.search(rf"^\s*{parameter.name}\b.*:", args, re.M), f"{name} does not document {parameter.name}"
  assert re.search(r"\b(19|20)\d\d\b", _section(doc, "References")), f"{name} cites no year"
  # Users have the papers and docs/algorithms.md, not our internal notes.
  assert not re.search(r"[Ss]eed 00\d|spec §|\[RECON\]|\[MEM\]", doc), f"{name} cites internal notes"


@pytest.mark.parametrize("name", CLASSES)
def test_states_document_their_fields(name):
  cls = getattr(jaxsync, name)
  doc = inspect.getdoc(cls)
  assert "Attributes:" in doc
  for field in cls._fields:
    assert f"{field}:" in doc, f"{name}.{field} is undocumented"


@pytest.mark.parametrize("name", RECONSTRUCTED)
def test_reconstructed_formulas_say_so(name):
  """A reading chosen is said in plain words and points to the documentation's section on it
  (tests/rules/test_docstring_sections.py checks that the section exists)."""
  doc = " ".join(inspect.getdoc(getattr(jaxsync, name)).split())
  assert "Reading chosen:" in doc
  assert re.search(r"the Algorithms page of the jaxsync documentation, sections? '", doc, re.I)


@pytest.mark.parametrize("name", ["jaxsync", *FUNCTIONS, *CLASSES])
def test_public_docstrings_cite_no_repository_path(name):
  """help() is read by pip users, who have the papers and the documentation site, not docs/*.md.
  (The submodules' own docstrings are checked with their modules.)"""
  doc = inspect.getdoc(jaxsync if name == "jaxsync" else getattr(jaxsync, name))
  assert not re.search(r"algorithms\.md|design\.md|docs/", doc), name


@pytest.mark.parametrize("name", FUNCTIONS)
def test_functions_lead_with_plain_words(name):
  """The summary and the paragraph after it come before any equation."""
  doc = inspect.getdoc(getattr(jaxsync, name))
  first_math = doc.find(".. math::")
  lead = doc if first_math < 0 else doc[:first_math]
  assert len(lead.split("\n\n")) >= 2 and len(lead.split()) >= 40, name


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples_run(module, scratch_registries):
  result = doctest.testmod(
    importlib.import_module(module), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
  )
  assert result.failed == 0


@pytest.mark.parametrize(
  "module",
  [jaxsync.calibration, jaxsync.datasets, jaxsync.dist, jaxsync.models, jaxsync.sim, jaxsync.strategies],
)
def test_submodules_document_every_public_name(module):
  assert module.__doc__
  public = {n for n in vars(module) if not n.startswith("_") and not inspect.ismodule(getattr(module, n))}
  assert public - set(module.__all__) - {"annotations"} == set()
  for name in module.__all__:
    doc = inspect.getdoc(getattr(module, name))
    assert doc and len(doc.splitlines()[0]) > 10, name


def test_every_module_is_in_a_package_so_its_examples_are_tested():
  """A folder without ``__init__.py`` is a namespace package: walk_packages skips it, so its docstring
  examples go untested. ``dist/`` in .gitignore once hid ``jaxsync/_src/dist/__init__.py`` from every
  clone."""
  import pathlib

  root = pathlib.Path(jaxsync._src.__file__).parent
  files = {
    ".".join(p.relative_to(root).with_suffix("").parts) for p in root.rglob("*.py") if p.name != "__init__.py"
  }
  assert {m.removeprefix("jaxsync._src.") for m in MODULES} == files
