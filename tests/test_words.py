"""What users read names papers and our own docs, never notes they do not have; every citation resolves."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
USER_FACING = sorted(
  [
    *ROOT.glob("jaxsync/**/*.py"),
    *(p for p in (ROOT / "configs").rglob("*") if p.is_file()),
    *(
      p
      for p in [*ROOT.glob("docs/**/*.md"), *ROOT.glob("docs/*.py")]
      if not any(p.is_relative_to(ROOT / "docs" / d) for d in ("_build", "_generated", "benchmarks/results"))
    ),  # the pages and their configuration; not what a build writes
    ROOT / "scripts" / "docs.sh",
    *ROOT.glob("benchmarks/**/*.py"),
    *ROOT.glob("benchmarks/results/*.md"),
    *ROOT.glob("examples/*.py"),
    ROOT / "README.md",
  ]
)
INTERNAL = re.compile(
  r"[Ss]eed 00\d|spec §|\b[Tt]he spec\b|\bspec's\b|\(spec\)|\bSpec:|\[RECON\]|\[MEM\]|\[SRC\]|/work/shared|shared/spec"
)


@pytest.mark.parametrize("path", USER_FACING, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_internal_note_is_named(path):
  hits = [
    f"{i}: {line.strip()}" for i, line in enumerate(path.read_text().splitlines(), 1) if INTERNAL.search(line)
  ]
  assert not hits, "\n".join(hits)


def test_every_citation_of_the_algorithm_notes_names_a_section_that_exists():
  notes = (ROOT / "docs" / "algorithms.md").read_text()
  sections = set(re.findall(r"^#{2,3} (\d+[a-d]?)\.", notes, re.M))
  assert {"0", "6", "11a", "11d", "15"} <= sections  # the numbering the code cites
  cited = set()
  for path in USER_FACING:
    for match in re.finditer(
      r"algorithms\.md ((?:§\d+[a-d]?(?:\.\d+)?(?:[-–,]\s?|\s(?:and|or)\s)?)+)", path.read_text()
    ):
      cited |= set(re.findall(r"§(\d+[a-d]?)", match.group(1)))
  assert cited, "nothing cites docs/algorithms.md"
  assert cited <= sections, sorted(cited - sections)


def test_the_strategy_list_cites_papers():
  from jaxsync._src.app import commands

  table = commands.strategies_table()
  assert not INTERNAL.search(table)
  assert "NeurIPS 2024" in table and "JPDC 2022" in table and "HPCAsia 2020" in table


def _tracked_text_files() -> list[pathlib.Path]:
  import subprocess

  listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
  suffixes = {".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".txt", ".cfg", ".json", ".html", ".css"}
  return [
    ROOT / f for f in listed.splitlines() if pathlib.Path(f).suffix in suffixes and (ROOT / f).is_file()
  ]


# A control character in a source or a page is an accident: an escape such as "\t" of "\theta" written into
# a non-raw docstring becomes a TAB, and MathJax then fails in the browser on a page the docs build passes.
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")  # TAB included: no file here indents with one


def test_no_source_or_page_holds_a_control_character():
  files = _tracked_text_files()
  assert len(files) > 100, "git ls-files found too few files: is this a checkout?"
  hits = [
    f"{path.relative_to(ROOT)}:{i}: {line.strip()[:80]!r}"
    for path in files
    for i, line in enumerate(path.read_text(errors="replace").split("\n"), 1)
    if CONTROL.search(line)
  ]
  assert not hits, "\n".join(hits)


def test_no_docstring_holds_a_control_character():
  # The same accident seen from the API pages' side: autodoc renders the docstring, not the source.
  import inspect

  import jaxsync

  owners = [getattr(jaxsync, name) for name in jaxsync.__all__]
  owners += [m for owner in list(owners) for _, m in inspect.getmembers(owner, inspect.isroutine)]
  # __doc__, not inspect.getdoc: getdoc expands TABs into spaces.
  bad = [repr(owner) for owner in owners if CONTROL.search(getattr(owner, "__doc__", None) or "")]
  assert not bad, bad
