"""Renders every page of the built site that holds math in headless Chromium; fails on a MathJax error.

Sphinx builds a page whose math MathJax cannot typeset (a TAB where ``\\theta`` was, a ``&`` outside an
aligned block) without a warning: the error shows only in the browser, as a red "Misplaced &" in place of
the equations. This renders each page the way a reader's browser does (MathJax 3 from the site's own
``_static/mathjax``, no network) and reads MathJax's output from the rendered DOM: every math block must
become a typeset ``mjx-container`` and none may hold an ``mjx-merror``.

    python scripts/check_math.py [SITE_DIR]      # default: docs/_build/html

Needs Chromium (Debian's package ``chromium``; ``scripts/docs.sh`` installs it where it can). Exit 0:
every page typeset; 1: a page has a MathJax error or math left untypeset (each listed); 2: no Chromium.
"""

from __future__ import annotations

import concurrent.futures
import html
import os
import pathlib
import re
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Sphinx marks math as <div class="math ..."> (display) and <span class="math ..."> (inline).
MATH = re.compile(r'<(?:div|span) class="math[ "]')
ERROR = re.compile(r'<mjx-merror[^>]*data-mjx-error="([^"]*)"|<mjx-merror[^>]*>(.{0,120})', re.S)
# An undefined macro (\thetta) is no error to MathJax: its noundefined package draws the name in red.
UNDEFINED = re.compile(r'<mjx-mtext[^>]*style="[^"]*color:\s*red[^"]*"[^>]*>(.{0,4000}?)</mjx-mtext>', re.S)
# MathJax's CHTML output writes each character as an element whose class is its code point: mjx-c5C is "\".
CHARACTER = re.compile(r'<mjx-c class="mjx-c([0-9A-F]+)')
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")


def browser() -> str | None:
  """The path of a Chromium-like browser, or None."""
  named = os.environ.get("CHROMIUM")
  return named or next((path for b in BROWSERS if (path := shutil.which(b))), None)


def rendered(chromium: str, page: pathlib.Path, timeout: float = 120.0) -> str:
  """The DOM of ``page`` after its scripts ran (MathJax typesets on load), as Chromium serializes it."""
  command = [
    chromium,
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--allow-file-access-from-files",
    "--virtual-time-budget=30000",  # run the page's timers (MathJax's typesetting) to completion
    "--dump-dom",
    page.resolve().as_uri(),
  ]
  return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=True).stdout


def _text(markup: str) -> str:
  """The text of a bit of MathJax output: its characters' code points, or its plain text."""
  codes = CHARACTER.findall(markup)
  return "".join(chr(int(c, 16)) for c in codes) if codes else re.sub(r"<[^>]+>", "", markup).strip()


def problems(page: pathlib.Path, dom: str) -> list[str]:
  """What is wrong with the math of ``page`` rendered as ``dom``: MathJax errors, undefined macros, and
  math left untypeset."""
  found = [
    html.unescape(m.group(1) or re.sub(r"<[^>]+>", "", m.group(2))).strip() for m in ERROR.finditer(dom)
  ]
  found += [f"undefined macro {html.unescape(_text(m.group(1)))}" for m in UNDEFINED.finditer(dom)]
  expected = len(MATH.findall(page.read_text()))
  typeset = dom.count("<mjx-container")
  if typeset < expected:
    found.append(f"{expected - typeset} of {expected} math blocks were not typeset")
  return found


def main(argv: list[str]) -> int:
  site = pathlib.Path(argv[0]) if argv else ROOT / "docs" / "_build" / "html"
  chromium = browser()
  if chromium is None:
    print("check_math: no Chromium found (apt-get install chromium, or set CHROMIUM=PATH)", file=sys.stderr)
    return 2
  pages = sorted(p for p in site.rglob("*.html") if MATH.search(p.read_text()))
  if not pages:
    print(f"check_math: no page of {site} holds math; was the site built?", file=sys.stderr)
    return 1
  with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    doms = list(pool.map(lambda p: rendered(chromium, p), pages))
  failed = {p: found for p, dom in zip(pages, doms) if (found := problems(p, dom))}
  for page, found in failed.items():
    print(f"check_math: {page.relative_to(site)}: " + "; ".join(found), file=sys.stderr)
  print(f"check_math: {len(pages) - len(failed)} of {len(pages)} pages with math typeset without an error")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
