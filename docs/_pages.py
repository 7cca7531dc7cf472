"""What docs/conf.py writes and rewrites at build time.

* ``_generated/config_keys.md``: every config key with its default, type and meaning, from the config
  dataclasses (``jaxsync._src.app.config_reference.reference_markdown``, the table ``jaxsync config`` prints);
  ``guide/configs.md`` includes it.
* ``_generated/strategy_options.md``: every strategy's options with their defaults (what
  ``jaxsync strategies`` prints); ``guide/strategies.md`` includes it.
* ``benchmarks/results/NAME.md``: one page per ``benchmarks/results/NAME.md`` of the repository, which
  includes it (its plots with it); ``benchmarks/index.md`` lists them with a glob.
* Links from a page to a file outside docs/ are written for GitHub (``../benchmarks/results/x.md``);
  :func:`rewrite_links_outside_docs` points those to a benchmark result, and to configs/README.md,
  at their pages in the site.

The written folders are in .gitignore.
"""

from __future__ import annotations

import pathlib
import re

RESULTS_PAGES = pathlib.Path("benchmarks") / "results"  # under docs/
GENERATED = pathlib.Path("_generated")  # under docs/, excluded from the pages: included fragments only

# An inline Markdown link or image: [text](target) or ![alt](target "title"); the target is group 2.
_LINK = re.compile(r"(!?\[(?:[^\]\\\n]|\\.)*\]\()\s*([^)\s]+)((?:\s+\"[^\"\n]*\")?\s*\))")


def config_keys_markdown() -> str:
  """The config reference: a Markdown table of keys per section."""
  from jaxsync._src.app import config_reference

  return config_reference.reference_markdown()


def strategy_options_markdown() -> str:
  """Every registered strategy: its summary, kind and options with their defaults and meanings."""
  from jaxsync import strategies

  out = []
  for name in strategies.names():
    info = strategies.describe(name)
    if info.alias_of:
      out += [f"### `{name}`", "", f"Another name for `{info.alias_of}`.", ""]
      continue
    kind = "synchronous" if info.synchronous else "asynchronous"
    out += [f"### `{name}`", "", f"*{kind.capitalize()}.* {info.summary}", ""]
    out += ["| option | default | meaning |", "|---|---|---|"]
    for option, default in info.options.items():
      meaning = info.meanings.get(option, "").replace("|", "\\|")
      out.append(f"| `{option}` | `{default!r}` | {meaning} |")
    out.append("")
  return "\n".join(out)


def _write_if_changed(path: pathlib.Path, text: str) -> None:
  """Writes ``text`` unless the file already holds it (an unchanged file is not rebuilt)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  if not path.exists() or path.read_text() != text:
    path.write_text(text)


def write_generated_pages(docs: pathlib.Path, root: pathlib.Path) -> None:
  _write_if_changed(docs / GENERATED / "config_keys.md", config_keys_markdown())
  _write_if_changed(docs / GENERATED / "strategy_options.md", strategy_options_markdown())
  results = sorted((root / "benchmarks" / "results").glob("*.md"))
  wanted = {f"{r.stem}.md" for r in results}
  pages = docs / RESULTS_PAGES
  pages.mkdir(parents=True, exist_ok=True)
  for stale in pages.glob("*.md"):
    if stale.name not in wanted:
      stale.unlink()
  for result in results:
    source = pathlib.Path("..", "..", "..", "benchmarks", "results", result.name).as_posix()
    _write_if_changed(
      pages / result.name,
      f"```{{include}} {source}\n:relative-images:\n```\n",
    )


def site_target(page: pathlib.Path, target: str, docs: pathlib.Path, root: pathlib.Path) -> str:
  """``target`` as a link from ``page`` in the site: a benchmark result's file becomes its page."""
  path, hash_, anchor = target.partition("#")
  if not path or re.match(r"^[a-z][a-z0-9+.-]*:", path, re.I):
    return target
  file = (page.parent / path).resolve()
  results = root / "benchmarks" / "results"
  if file.suffix == ".md" and file.parent == results:
    new = docs / RESULTS_PAGES / file.name
  elif file == root / "README.md":
    new = docs / "index.md"
  elif file == root / "configs" / "README.md":  # included whole by guide/configs.md
    new = docs / "guide" / "configs.md"
  else:
    return target
  return pathlib.Path(_relative(new, page.parent)).as_posix() + hash_ + anchor


def _relative(path: pathlib.Path, start: pathlib.Path) -> str:
  import os

  return os.path.relpath(path, start)


def rewrite_links_outside_docs(app, docname: str, source: list[str]) -> None:
  """``source-read`` handler: a page's links to benchmark results lead to their pages in the site."""
  docs = pathlib.Path(app.srcdir)
  page = docs / f"{docname}.md"
  root = docs.parent
  source[0] = _LINK.sub(
    lambda m: m.group(1) + site_target(page, m.group(2), docs, root) + m.group(3), source[0]
  )
