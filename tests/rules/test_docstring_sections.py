"""Every section of the Algorithms page that a public docstring cites exists, under that exact heading.

The public docstrings (``help(jaxsync.adaptive_k)``, the API pages of the documentation) cite
``the Algorithms page of the jaxsync documentation, section '<heading>'``, a page a pip user
can open, never ``docs/algorithms.md §N``, a path they do not have. The heading text is the
one ``docs/algorithms.md`` gives its section, number included.
"""

from __future__ import annotations

import inspect
import pathlib
import re

import pytest

import jaxsync

ROOT = pathlib.Path(__file__).resolve().parents[2]
# "section 'a'", "sections 'a' and 'b'", "sections 'a', 'b' and 'c'".
SECTIONS = re.compile(r"\bsections?\s+((?:'[^']+'(?:,\s*|\s+and\s+)?)+)")


def _headings() -> set[str]:
  text = (ROOT / "docs" / "algorithms.md").read_text()
  return {m.group(1).strip() for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M)}


def _public_docstrings() -> dict[str, str]:
  docs = {"jaxsync": jaxsync.__doc__}
  for name in jaxsync.__all__:
    value = getattr(jaxsync, name)
    if not inspect.ismodule(value):
      docs[name] = inspect.getdoc(value) or ""
  return docs


def cited_sections(doc: str) -> list[str]:
  """The headings quoted as ``section '...'`` (or ``sections 'a' and 'b'``), whitespace collapsed."""
  flat = " ".join(doc.split())
  return [name for m in SECTIONS.finditer(flat) for name in re.findall(r"'([^']+)'", m.group(1))]


def test_the_pattern_reads_every_form():
  doc = (
    "the Algorithms page of the jaxsync documentation, sections '6. OrMo' and '7.\n"
    "  OrMo-DA'. In the section named (section '1. BSP / synchronous SGD with momentum');"
  )
  assert cited_sections(doc) == ["6. OrMo", "7. OrMo-DA", "1. BSP / synchronous SGD with momentum"]


def test_the_docstrings_cite_the_documentation_by_section():
  cited = {name: cited_sections(doc) for name, doc in _public_docstrings().items()}
  # The check below would pass vacuously if nothing were cited.
  for name in ("ordered_momentum", "adaptive_k", "bb_step_size", "scale_by_staleness", "smega2", "jaxsync"):
    assert cited[name], name
  assert "11a. Adaptive k: the two error-bound tests" in cited["adaptive_k"]


@pytest.mark.parametrize("name", sorted(_public_docstrings()))
def test_every_cited_section_is_a_heading_of_the_algorithms_page(name):
  headings = _headings()
  missing = [s for s in cited_sections(_public_docstrings()[name]) if s not in headings]
  assert not missing, f"{name} cites sections that docs/algorithms.md does not have: {missing}"


def test_a_renamed_heading_is_caught():
  assert "6. OrMo" in _headings()
  assert "6. Ordered momentum" not in _headings()
