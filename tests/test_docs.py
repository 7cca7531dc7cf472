"""The docs' cross-references resolve: every cited section of docs/design.md exists, and every relative
link in the README and docs/ points to a file (and heading) that exists. And the documentation site
holds together without being built (scripts/docs.sh builds it, warnings as errors): every page is in a
toctree, the API reference documents every public name, the README stays short and its example runs.

Code and docs cite the design notes by section name, in forms such as
``design.md, "Errors"``, ``docs/design.md's "Layers"``, ``design.md ("Layers")``,
or wrapped over lines of a docstring, a comment or a paragraph. A citation must
name a heading of docs/design.md exactly (the heading's backticks may be left
out), and one heading only. A renamed section fails here until its citations
follow it.
"""

from __future__ import annotations

import ast
import os
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"

# Where citations may be: the package, tests, benchmarks, examples, configs and every doc.
SCANNED_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".sh"}
SKIPPED_ANYWHERE = {".git", ".venv", "venv", "__pycache__", ".pytest_cache", ".hypothesis", ".ruff_cache"}
SKIPPED_AT_ROOT = {"build", "dist", "runs"}  # build output and run directories (.gitignore's /build/, /dist/)
DOCS = ROOT / "docs"
# What docs/conf.py and Sphinx write into docs/ (ignored by git): the site, and the generated pages.
DOCS_BUILD_OUTPUT = {DOCS / "_build", DOCS / "_generated", DOCS / "benchmarks" / "results"}

# "design.md" (maybe in backticks) then "'s", "," or "(", then a quoted name. The gap may wrap onto a
# comment's next line. A bare "design.md", naming no section, is not a citation.
CITATION = re.compile(r"design\.md`?(?:'s|,|\s*\()[\s#]*[\"“]([^\"”]+)[\"”]")


# Markdown files whose relative links must resolve.
def doc_pages() -> list[pathlib.Path]:
  """Every Markdown page of the documentation's source (docs/, its build output left out)."""
  return sorted(p for p in DOCS.rglob("*.md") if not any(p.is_relative_to(d) for d in DOCS_BUILD_OUTPUT))


LINKED_DOCS = sorted([ROOT / "README.md", *doc_pages(), *ROOT.glob("configs/**/*.md")])
INLINE_LINK = re.compile(r"!?\[(?:[^\]\\\n]|\\.)*\]\(\s*(?:<([^>\n]*)>|([^)\s]+))(?:\s+\"[^\"\n]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^ {0,3}\[[^\]\n]+\]:[ \t]*(?:<([^>\n]*)>|(\S+))", re.M)
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # http:, https:, mailto:, ...


def scanned_files() -> list[pathlib.Path]:
  """Every text file of the repository that may cite the notes (this test's own examples left out)."""
  files = []
  for folder, dirs, names in os.walk(ROOT):
    here = pathlib.Path(folder)
    dirs[:] = [
      d
      for d in dirs
      if d not in SKIPPED_ANYWHERE
      and not d.endswith(".egg-info")
      and not (here == ROOT and d in SKIPPED_AT_ROOT)
      and here / d not in DOCS_BUILD_OUTPUT
    ]
    files += [here / n for n in names if pathlib.Path(n).suffix in SCANNED_SUFFIXES]
  own = pathlib.Path(__file__).resolve()
  return sorted(p for p in files if p.resolve() != own)


def _prose(text: str) -> str:
  """``text`` with its fenced code blocks blanked (line numbers kept)."""
  lines, fenced = [], False
  for line in text.splitlines():
    if line.lstrip().startswith(("```", "~~~")):
      fenced = not fenced
      lines.append("")
    else:
      lines.append("" if fenced else line)
  return "\n".join(lines)


def _line(text: str, offset: int) -> int:
  return text.count("\n", 0, offset) + 1


def headings(markdown: str) -> list[str]:
  """The text of every ATX heading (``## Name``) outside fenced code blocks."""
  return [m.group(1).strip() for m in re.finditer(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", _prose(markdown), re.M)]


def citations(text: str) -> list[tuple[int, str]]:
  """(line, section name) of every design.md section ``text`` cites; a name's line wraps read as spaces."""
  found = []
  for m in CITATION.finditer(text):
    name = re.sub(r"\s*\n\s*#?\s*", " ", m.group(1))
    found.append((_line(text, m.start()), " ".join(name.split())))
  return found


def repository_citations() -> list[tuple[str, int, str]]:
  """(file, line, section name) of every citation of design.md in the repository."""
  return [
    (str(path.relative_to(ROOT)), line, name)
    for path in scanned_files()
    for line, name in citations(path.read_text(errors="replace"))
  ]


def _names(heading: str) -> set[str]:
  return {heading, heading.replace("`", "")}


def unresolved(cited: list[tuple[str, int, str]], design: str) -> list[str]:
  """The citations that name no heading of ``design``, or several."""
  all_headings = headings(design)
  problems = []
  for path, line, name in cited:
    count = sum(name in _names(heading) for heading in all_headings)
    if count != 1:
      what = "no section" if count == 0 else f"{count} sections"
      problems.append(f'{path}:{line}: design.md has {what} named "{name}"')
  return problems


def github_anchor(heading: str) -> str:
  """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
  return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
  """Every heading anchor of a Markdown file, a repeated one numbered as GitHub numbers it."""
  seen: dict[str, int] = {}
  for heading in headings(markdown):
    anchor = github_anchor(heading)
    seen[anchor] = seen.get(anchor, -1) + 1
    if seen[anchor]:
      seen[f"{anchor}-{seen[anchor]}"] = 0
  return set(seen)


def relative_links(markdown: str) -> list[tuple[int, str]]:
  """(line, target) of every link that is not an external URL, outside code blocks and code spans."""
  text = _prose(markdown)
  text = re.sub(r"`[^`\n]*`", lambda m: " " * len(m.group(0)), text)
  found = [(m.start(), m.group(1) or m.group(2)) for m in INLINE_LINK.finditer(text)]
  found += [(m.start(), m.group(1) or m.group(2)) for m in REFERENCE_LINK.finditer(text)]
  return [(_line(text, start), target) for start, target in sorted(found) if not EXTERNAL.match(target)]


def broken_links(doc: pathlib.Path) -> list[str]:
  broken = []
  for line, target in relative_links(doc.read_text()):
    path, _, anchor = target.partition("#")
    file = (doc.parent / path).resolve() if path else doc
    where = f"{doc.relative_to(ROOT)}:{line}: {target}"
    if not file.is_relative_to(ROOT):
      broken.append(f"{where} (outside the repository)")
    elif not file.exists():
      broken.append(f"{where} (no such file)")
    elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
      broken.append(f"{where} (no heading with that anchor in {file.relative_to(ROOT)})")
  return broken


# -- citations of the design notes ---------------------------------------------------------------------


def test_the_citation_pattern_reads_every_form():
  text = (
    'Two kinds (design.md, "Learning-rate placement"):\n'
    'see docs/design.md\'s "Errors" and `docs/design.md`, "Where a push+pull\'s time went".\n'
    '"""Gating (design.md,\n'
    '    "Release signal")."""\n'
    '# docs/design.md, "A long\n'
    '# name" and design.md ("Layers")\n'
    'design.md alone, and ROOT / "docs" / "design.md", "r" cite nothing.\n'
  )
  assert citations(text) == [
    (1, "Learning-rate placement"),
    (2, "Errors"),
    (2, "Where a push+pull's time went"),
    (3, "Release signal"),
    (5, "A long name"),
    (6, "Layers"),
  ]


def test_the_repository_cites_the_design_notes():
  # The pattern must find what is known to be there, or the checks below would pass vacuously.
  cited = {(path, name) for path, _, name in repository_citations()}
  for known in [
    ("jaxsync/__init__.py", "Learning-rate placement"),
    ("jaxsync/_src/rules/release.py", "Release signal"),
    ("jaxsync/_src/rules/guard.py", "Errors"),
    ("tests/test_architecture.py", "Layers"),
  ]:
    assert known in cited, sorted(cited)


def test_every_cited_section_of_the_design_notes_exists_once():
  problems = unresolved(repository_citations(), DESIGN.read_text())
  assert not problems, "\n".join(problems)


def test_a_renamed_section_is_caught():
  # The check on a copy of the notes in which the first cited section is renamed, or doubled.
  design = DESIGN.read_text()
  path, line, name = repository_citations()[0]
  renamed, n = re.subn(rf"^(#+)[ \t]+{re.escape(name)}[ \t]*$", r"\1 Renamed", design, flags=re.M)
  assert n == 1
  assert unresolved([(path, line, name)], design) == []
  assert unresolved([(path, line, name)], renamed) == [
    f'{path}:{line}: design.md has no section named "{name}"'
  ]
  twice = f"{design}\n## {name}\n"
  assert unresolved([(path, line, name)], twice) == [
    f'{path}:{line}: design.md has 2 sections named "{name}"'
  ]


# -- relative links ------------------------------------------------------------------------------------


def test_the_link_pattern_reads_every_form():
  text = (
    'See [the notes](docs/algorithms.md) and ![a plot](<results/a b.png> "title"),\n'
    "[web](https://example.com), [here](#a-heading), `[not](a-link.md)`\n"
    "```\n"
    "[not](in/code.md)\n"
    "```\n"
    "[ref]: configs/quickstart.yaml\n"
  )
  assert relative_links(text) == [
    (1, "docs/algorithms.md"),
    (1, "results/a b.png"),
    (2, "#a-heading"),
    (6, "configs/quickstart.yaml"),
  ]


def test_github_anchors():
  assert github_anchor("Where a push+pull's time went") == "where-a-pushpulls-time-went"
  assert github_anchor("Why the folder is `distributed` and the module `jaxsync.dist`") == (
    "why-the-folder-is-distributed-and-the-module-jaxsyncdist"
  )
  assert anchors("# A\n## A\n```\n# not a heading\n```\n## b c\n") == {"a", "a-1", "b-c"}


def test_a_broken_link_is_caught(tmp_path, monkeypatch):
  monkeypatch.setitem(globals(), "ROOT", tmp_path)
  (tmp_path / "there.md").write_text("# Here\n")
  doc = tmp_path / "README.md"
  doc.write_text("[ok](there.md#here) [gone](gone.md) [no heading](there.md#nowhere) [up](../x.md)\n")
  assert broken_links(doc) == [
    "README.md:1: gone.md (no such file)",
    "README.md:1: there.md#nowhere (no heading with that anchor in there.md)",
    "README.md:1: ../x.md (outside the repository)",
  ]


@pytest.mark.parametrize("doc", LINKED_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_to_a_file_that_exists(doc):
  broken = broken_links(doc)
  assert not broken, "\n".join(broken)


# -- the README and the documentation site -------------------------------------------------------------

README = ROOT / "README.md"
README_MAX_LINES = 200
# A citation of a README section: README, "Install and run" / the README's "Results" (maybe wrapped).
README_CITATION = re.compile(r"README(?:'s|,)[\s#]*[\"“]([^\"”]+)[\"”]")
DIRECTIVE_BLOCK = re.compile(r"^```\{(\w[\w-]*)\}[ \t]*(.*)\n((?:(?!```).*\n)*?)```", re.M)
API_PAGES = {
  "jaxsync": "jaxsync.md",
  "jaxsync.strategies": "strategies.md",
  "jaxsync.sim": "sim.md",
  "jaxsync.calibration": "calibration.md",
  "jaxsync.planning": "planning.md",
  "jaxsync.dist": "dist.md",
  "jaxsync.models": "models.md",
  "jaxsync.datasets": "datasets.md",
}
API_DIRECTIVE = re.compile(
  r"^\.\. (?:auto(?:function|class|exception|data)|py:(?:function|class|exception|data))::\s+(\S+)", re.M
)


def directives(markdown: str) -> list[tuple[str, str, list[str]]]:
  """(name, argument, body lines) of every MyST directive written as a fenced block: ```{toctree} ...```."""
  return [
    (m.group(1), m.group(2).strip(), m.group(3).splitlines()) for m in DIRECTIVE_BLOCK.finditer(markdown)
  ]


def toctree_entries(page: pathlib.Path, pages: list[pathlib.Path]) -> set[pathlib.Path]:
  """The pages that ``page``'s toctrees list (glob entries matched against ``pages``)."""
  found = set()
  for name, _, body in directives(page.read_text()):
    if name != "toctree":
      continue
    glob = any(line.strip() == ":glob:" for line in body)
    for line in body:
      entry = line.strip()
      if not entry or entry.startswith(":"):
        continue
      entry = re.sub(r"^.*<(.+)>$", r"\1", entry)  # "Title <page>"
      target = (page.parent / entry).resolve()
      if glob and any(c in entry for c in "*?["):
        found |= {p for p in pages if p.with_suffix("").match(str(target))}
      else:
        found.add(target.with_suffix(".md"))
  return found


def unreachable_pages(pages: list[pathlib.Path], index: pathlib.Path) -> list[pathlib.Path]:
  """The pages no chain of toctrees from ``index`` reaches (Sphinx's "document isn't included in any
  toctree")."""
  seen, todo = {index}, [index]
  while todo:
    for page in toctree_entries(todo.pop(), pages):
      if page in pages and page not in seen:
        seen.add(page)
        todo.append(page)
  return [p for p in pages if p not in seen]


def test_the_readme_is_short():
  lines = len(README.read_text().splitlines())
  assert lines <= README_MAX_LINES, (
    f"README.md has {lines} lines; at most {README_MAX_LINES} (the rest: docs/)"
  )


def test_the_toctree_reader(tmp_path):
  (tmp_path / "guide").mkdir()
  pages = [tmp_path / n for n in ("index.md", "a.md", "guide/b.md", "guide/c.md", "lost.md")]
  for page in pages:
    page.write_text("# Page\n")
  pages[0].write_text("# Home\n\n```{toctree}\n:maxdepth: 2\n\na\nThe guide <guide/b>\n```\n")
  pages[2].write_text("# B\n\n```{toctree}\n:glob:\n\n*\n```\n")
  assert unreachable_pages(pages, pages[0]) == [tmp_path / "lost.md"]


def test_every_page_of_the_docs_is_in_a_toctree():
  pages = [p.resolve() for p in doc_pages()]
  lost = unreachable_pages(pages, (DOCS / "index.md").resolve())
  assert not lost, "not in any toctree from docs/index.md: " + ", ".join(
    str(p.relative_to(ROOT)) for p in lost
  )


def test_what_the_docs_include_exists():
  # {include} blocks: the README's figure paragraphs (between markers), configs/README.md, the
  # generated config and strategy tables (docs/_generated/, written by docs/_pages.py).
  generated = {"config_keys.md", "strategy_options.md"}
  problems = []
  for page in doc_pages():
    for name, argument, body in directives(page.read_text()):
      if name != "include":
        continue
      target = (page.parent / argument).resolve()
      where = f"{page.relative_to(ROOT)}: {argument}"
      if target.parent == (DOCS / "_generated").resolve():
        if target.name not in generated:
          problems.append(f"{where} (docs/_pages.py writes no such file)")
        continue
      if not target.exists():
        problems.append(f"{where} (no such file)")
        continue
      text = target.read_text()
      for line in body:
        option, _, value = line.strip().partition(": ")
        if option in (":start-after", ":end-before") and value not in text:
          problems.append(f"{where} ({value!r} is not in {target.name})")
  assert not problems, "\n".join(problems)


def _public_names(module: str) -> list[str]:
  """The ``__all__`` of a public module, read without importing it."""
  path = ROOT / (module.replace(".", "/") + ".py")
  if not path.exists():
    path = ROOT / module.replace(".", "/") / "__init__.py"
  for node in ast.parse(path.read_text()).body:
    if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
      return list(ast.literal_eval(node.value))
  raise AssertionError(f"{path} has no __all__")


@pytest.mark.parametrize("module", sorted(API_PAGES))
def test_the_api_reference_documents_every_public_name(module):
  page = DOCS / "api" / API_PAGES[module]
  documented = set(API_DIRECTIVE.findall(page.read_text()))
  submodules = {m.rpartition(".")[2] for m in API_PAGES if m != "jaxsync"} if module == "jaxsync" else set()
  missing = [n for n in _public_names(module) if n not in submodules and n not in documented]
  assert not missing, f"docs/api/{API_PAGES[module]} documents none of {missing}"


def test_every_cited_readme_section_exists():
  # A citation of the README's sections may name a heading of the README or of a page of the docs,
  # where the README's sections moved.
  names = {n for doc in [README, *doc_pages()] for h in headings(doc.read_text()) for n in _names(h)}
  cited = [
    (
      str(path.relative_to(ROOT)),
      _line(text, m.start()),
      " ".join(re.sub(r"\s*\n\s*#?\s*", " ", m.group(1)).split()),
    )
    for path in scanned_files()
    for text in [path.read_text(errors="replace")]
    for m in README_CITATION.finditer(text)
  ]
  assert ("configs/README.md", "Install and run") in {(p, n) for p, _, n in cited}  # the pattern finds them
  problems = [
    f'{p}:{line}: no heading "{name}" in README.md or docs/' for p, line, name in cited if name not in names
  ]
  assert not problems, "\n".join(problems)


def test_the_readme_example_runs(capsys):
  blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.S | re.M)
  assert len(blocks) == 1, "the README has one Python example"
  exec(compile(blocks[0], "README.md", "exec"), {"__name__": "readme_example"})
  assert capsys.readouterr().out == "1\n"


# -- the Results page against the results files ----------------------------------------------------------------

_NUMBER = re.compile(r"(?<![\w.])\d+(?:,\d{3})*(?:\.\d+)?")


def _numbers_in(text: str) -> set[str]:
  """Every number of a results file, as written, rounded to fewer decimals (6.53: 6.5, 7) and, for a
  fraction (0.803), as a percentage (80.3, 80)."""
  found = set()
  for token in _NUMBER.findall(text):
    token = token.replace(",", "")
    found.add(token)
    decimals = len(token.partition(".")[2])
    value = float(token)
    for digits in range(decimals):
      found.add(f"{value:.{digits}f}")
    if value <= 1 and decimals:
      for digits in range(max(decimals - 1, 1)):
        found.add(f"{100 * value:.{digits}f}")
  return found


def verdict_rows(page: str) -> list[tuple[str, str, list[str]]]:
  """(claim, verdict, results files) of each row of the Results page's verdict table; "same" reuses the
  files of the row above."""
  rows, files = [], []
  for line in page.splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("| ") else []
    if len(cells) != 4 or cells[0] == "paper":
      continue
    # A results file linked, or named as a path (an archived one, which the site does not publish).
    linked = re.findall(
      r"\(\.\./benchmarks/results/([\w./-]+\.md)\)|`benchmarks/results/([\w./-]+\.md)`", cells[3]
    )
    linked = [a or b for a, b in linked]
    files = linked or files
    rows.append((cells[1], cells[2], files))
  return rows


def test_every_number_of_a_verdict_is_in_its_results_file():
  """A verdict on the Results page quotes its results files: a number that none of them holds (a typo, a
  rerun that moved it, a figure computed by hand) fails here."""
  page = (ROOT / "docs" / "results.md").read_text()
  rows = verdict_rows(page)
  assert len(rows) + len(_results_page().rows()) >= 20, rows  # the hand-written rows and the generated ones
  wrong = []
  for claim, verdict, files in rows:
    assert files, claim
    held = set().union(*(_numbers_in((ROOT / "benchmarks" / "results" / f).read_text()) for f in files))
    missing = [n.replace(",", "") for n in _NUMBER.findall(verdict) if n.replace(",", "") not in held]
    if missing:
      wrong.append(f"{claim[:50]}: {missing} not in {files}")
  assert not wrong, "\n".join(wrong)


def rerun_sections(page: str) -> list[tuple[str, list[str], str]]:
  """(heading, results files, text) of each section of the reruns on the Results page (Fashion-MNIST's and the
  language model's): the files it links or names, its text without figures, links and the sentences about the
  first round (their numbers are history, in no current file)."""
  body = page[page.index("## The reruns") : page.index("## The digits reproductions")]
  sections = []
  for section in re.split(r"\n(?=### )", body)[1:]:
    named = re.findall(r"`([\w-]+\.md)`", section) + re.findall(r"benchmarks/results/([\w./-]+\.md)", section)
    files = sorted({f for f in named if (ROOT / "benchmarks" / "results" / f).exists()})
    text = re.sub(r"!?\[[^\]]*\]\([^)]*\)", "", section)
    sentences = re.split(r"(?<=[.;])\s+(?=[A-Z*(])", text)
    text = " ".join(s for s in sentences if "first round" not in s)
    sections.append((section.splitlines()[0], files, text))
  return sections


def test_every_number_of_a_rerun_section_is_in_its_results_file():
  """The prose under each Fashion-MNIST rerun quotes the results files it links (run counts, minutes,
  speed-ups, p-values): a number none of them holds fails here, as for the verdict rows."""
  sections = rerun_sections((ROOT / "docs" / "results.md").read_text())
  assert len(sections) >= 6, [h for h, _, _ in sections]
  wrong = []
  for heading, files, text in sections:
    assert files, heading
    results = ROOT / "benchmarks" / "results"
    # A results file and its verdicts (their evidence at half the budget too).
    paths = [results / f for f in files] + [results / f.replace(".md", "_verdicts.json") for f in files]
    held = set().union(*(_numbers_in(path.read_text()) for path in paths if path.exists()))
    numbers = [n.replace(",", "") for n in _NUMBER.findall(text)]
    missing = [n for n in numbers if n not in held]
    if missing:
      wrong.append(f"{heading}: {missing} not in {files}")
  assert not wrong, "\n".join(wrong)


def test_a_rerun_section_reads_its_files_and_skips_the_first_round():
  page = (
    "## The reruns\n\n### A\n\nIt ran 12 runs ([`x.md`](../benchmarks/results/ormo_table.md)). "
    "**What changed from the first round** (1.5 epochs): 80.3 before. Then 7.5 points, see `server_bound.md`."
    "\n\n## The digits reproductions\n"
  )
  ((heading, files, text),) = rerun_sections(page)
  assert heading == "### A" and files == ["ormo_table.md", "server_bound.md"]
  assert "12" in text and "7.5" in text and "1.5" not in text and "80.3" not in text


def test_a_number_the_results_file_lacks_is_caught():
  assert {"80.3", "80", "0.803", "0.80", "1316", "6.5", "7"} <= _numbers_in(
    "EA-wild 0.803 ± 0.003, ASP's 1,316, 6.53"
  )
  assert not {"80.30", "6.6", "0.81"} & _numbers_in("EA-wild 0.803 ± 0.003, ASP's 1,316, 6.53")
  rows = verdict_rows(
    "| a | b | **partly**: 81.2 | [`x.md`](../benchmarks/results/x.md) |\n| c | d | e | same |"
  )
  assert rows == [("b", "**partly**: 81.2", ["x.md"]), ("d", "e", ["x.md"])]


def _results_page():
  import importlib

  return importlib.import_module("benchmarks.pages.results_page")


def test_the_generated_verdicts_are_the_benchmarks_own():
  """The Results page's generated table is exactly what the benchmarks' verdict files say."""
  results_page = _results_page()
  marked = results_page.MARKED.search((ROOT / "docs" / "results.md").read_text())
  assert marked, "docs/results.md lost its '<!-- verdicts: generated -->' markers"
  assert marked.group(2) == results_page.block(), "run `python -m benchmarks.pages.results_page`"


def test_a_verdict_file_becomes_summary_rows_the_paper_once_a_budget_sensitive_claim_marked(tmp_path):
  import json

  verdict = {
    "paper": "P (2020)", "claim": "c", "verdict": "**reproduced**", "evidence": "1.5x | ASP", "budget": "10 epochs",
    "seeds": "3-5", "picks": "ASP 0.01", "at_half": "**not reproduced**", "budget_sensitive": True,
    "decides": "1.5x | ASP (p = 0.010 after Holm)",
  }  # fmt: skip
  second = {
    **verdict,
    "claim": "d",
    "verdict": "**partly** (sync wins at 8 workers)",
    "budget_sensitive": False,
  }
  second["decides"] = None
  (tmp_path / "bench_verdicts.json").write_text(json.dumps([verdict, second]))
  results_page = _results_page()
  assert results_page.rows(tmp_path) == [
    "| P (2020) | c | **reproduced** ½ | 1.5x / ASP (p = 0.010 after Holm) "
    "| [results](../benchmarks/results/bench.md) |",
    "|  | d | **partly** | - | [results](../benchmarks/results/bench.md) |",  # the results file keeps the rest
  ]
  assert results_page.block(tmp_path / "none").startswith("No benchmark has recorded")
  assert "½ Budget-sensitive: at half the budget" in results_page.block(tmp_path)  # the marker's legend


def test_a_papers_claims_from_a_second_benchmark_sit_under_its_first(tmp_path):
  import json

  def verdict(paper, claim):
    return {"paper": paper, "claim": claim, "verdict": "**holds**", "decides": "+1 point"}

  (tmp_path / "family_verdicts.json").write_text(
    json.dumps([verdict("A (2023)", "mlp"), verdict("B (2024)", "b")])
  )
  (tmp_path / "family_lm_verdicts.json").write_text(
    json.dumps([verdict("A (2023)", "lm"), verdict("C", "c")])
  )
  found = [row.split(" | **")[0] for row in _results_page().rows(tmp_path)]
  assert found == ["| A (2023) | mlp", "|  | lm", "| B (2024) | b", "| C | c"]
  assert _results_page().rows(tmp_path)[1].endswith("(../benchmarks/results/family_lm.md) |")


def test_the_summary_figure_draws_every_measured_comparison_of_the_verdict_files(tmp_path):
  import json

  comparisons = [
    {"label": "16 nodes: speed-up over ASP (log)", "effect": -0.2, "p": 0.01},
    {"label": "EA-wild against Hogwild (points)", "effect": 1.5, "p": 0.3},
    {"label": "not measured (points)", "effect": None, "p": None},
    {"label": "within 1 point", "effect": -0.4, "p": None},
  ]
  verdict = {"paper": "P (2020)", "claim": "c", "comparisons": comparisons}
  (tmp_path / "bench_verdicts.json").write_text(
    json.dumps([verdict, {**verdict, "claim": "d", "comparisons": []}])
  )
  results_page = _results_page()
  E = results_page.Effect
  assert results_page.effects(tmp_path) == [
    E("P: c", "speed-up", -0.2, 0.01), E("P: c", "points", 1.5, 0.3), E("P: c", "points", -0.4, None)
  ]  # fmt: skip
  assert results_page.figure(tmp_path, tmp_path / "f.png").stat().st_size > 1000
  assert results_page.figure(tmp_path / "none", tmp_path / "g.png") is None
  # The committed figure is drawn from the committed verdict files, each of which records its comparisons.
  drawn = results_page.effects()
  assert len(drawn) >= 100 and {e.unit for e in drawn} == {"points", "speed-up"}
  page = (ROOT / "docs" / "results.md").read_text()
  assert "](../benchmarks/results/verdict_effects.png)" in page


def test_the_first_screen_check_measures_where_a_rendered_table_ends(tmp_path):
  """scripts/check_first_screen.py renders the page in Chromium at 1,280 x 800 px and reads the first table's
  bottom edge from the page's own layout: 5 rows of 30 px end within the screen, 40 do not."""
  import importlib.util

  spec = importlib.util.spec_from_file_location(
    "check_first_screen", ROOT / "scripts" / "check_first_screen.py"
  )
  check = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(check)
  chromium = check.browser()
  if chromium is None:
    pytest.skip("no Chromium here (scripts/docs.sh installs it)")
  site = tmp_path / "html"
  site.mkdir()
  for rows, fits in ((5, True), (40, False)):
    cells = "".join('<tr style="height:30px"><td>x</td></tr>' for _ in range(rows))
    body = f'<body style="margin:0"><h1 style="margin:0;height:100px">R</h1><table>{cells}</table></body>'
    (site / "results.html").write_text(f"<html>{body}</html>")
    bottom, right = check.first_table_edges(chromium, site / "results.html")
    assert bottom == pytest.approx(100 + rows * 30, abs=rows * 2 + 4) and 0 < right < 1280
    assert check.main([str(site)]) == (0 if fits else 1)


def test_the_math_check_reads_mathjax_errors_and_untypeset_math_from_a_rendered_page(tmp_path):
  # scripts/check_math.py renders the built pages in Chromium (scripts/docs.sh); here, what it reads from
  # a rendered DOM: MathJax's error element (what the diloco page showed) and math left untypeset.
  import importlib.util

  spec = importlib.util.spec_from_file_location("check_math", ROOT / "scripts" / "check_math.py")
  check_math = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(check_math)
  page = tmp_path / "p.html"
  page.write_text(
    '<div class="math notranslate nohighlight">\\[a\\]</div><span class="math notranslate">\\(b\\)</span>'
  )
  good = "<mjx-container><mjx-math>a</mjx-math></mjx-container> <mjx-container>b</mjx-container>"
  assert check_math.problems(page, good) == []
  bad = '<mjx-container><mjx-merror data-mjx-error="Misplaced &amp;" title="Misplaced &amp;">x</mjx-merror></mjx-container>'
  assert check_math.problems(page, bad) == ["Misplaced &", "1 of 2 math blocks were not typeset"]
  # An undefined macro (\\thetta): MathJax draws it in red, one element per character (its code point).
  chars = "".join(f'<mjx-c class="mjx-c{ord(c):X}"></mjx-c>' for c in "\\thetta")
  undefined = good + f'<mjx-mtext class="mjx-n" space="4" style="color: red;">{chars}</mjx-mtext>'
  assert check_math.problems(page, undefined) == ["undefined macro \\thetta"]


def test_the_streaming_diloco_reading_says_maxtexts_schedule_differs_from_torchfts():
  # MaxText (0.2.5) applies the outer step at the round's end and mixes tau steps later: with an overlap its
  # schedule is not torchft's, which jaxsync follows. The page once said the two agree.
  page = (ROOT / "docs" / "algorithms.md").read_text()
  reading = page[page.index("follow torchft's `StreamingDiLoCo`") :][:700]
  assert "which agree" not in reading
  assert (
    "MaxText" in reading
    and "differ with τ > 0" in reading
    and "jaxsync follows torchft's schedule" in reading
  )


def test_every_benchmark_command_in_the_docs_names_a_benchmark_of_the_catalog():
  # The benchmarks moved into groups (python -m benchmarks.GROUP.NAME): a page that still names an old
  # path, or a module that does not exist, would send a reader to nothing.
  from benchmarks.common import catalog

  pages = [
    ROOT / "README.md",
    *doc_pages(),
    *ROOT.glob("configs/**/*.md"),
    *ROOT.glob("benchmarks/results/*.md"),
  ]
  named, stale = set(), []
  for page in pages:
    text = page.read_text()
    named |= {(page.name, m) for m in re.findall(r"python -m\s+(benchmarks\.[\w.]+)", text)}
    stale += [f"{page.name}: {m}" for m in re.findall(r"python3? benchmarks/[\w/]+\.py", text)]
  assert not stale, stale
  modules = {catalog.module(n) for names in catalog.GROUPS.values() for n in names}
  placeholders = {
    "benchmarks.GROUP.NAME",
    "benchmarks.claims.NAME",
    "benchmarks.speed.NAME",
    "benchmarks.pages.NAME",
  }
  unknown = sorted(f"{page}: {m}" for page, m in named if m not in modules | placeholders)
  assert not unknown, unknown
  assert len(named) > 20
