"""Renders the built Results page in headless Chromium at 1,280 x 800 px and checks that its summary table of
verdicts ends within that first screen; writes the screenshot.

The Results page's first table (``docs/results.md``'s generated summary: paper, claim, verdict, the number it
turns on, a link) is what a reader comes for; it must be read without scrolling on a laptop's screen. This
renders the page as a reader's browser does and measures where the table ends, from the page's own layout.

    python scripts/check_first_screen.py [SITE_DIR] [--screenshot PNG]   # default: docs/_build/html

Exit 0: the table ends within the first screen; 1: it does not (by how many pixels); 2: no Chromium.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from check_math import browser  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
WIDTH, HEIGHT = 1280, 800
# Appended to the page: the first table's bottom edge, in CSS pixels from the top of the page, as an
# attribute of <body>, which Chromium's --dump-dom serializes.
MEASURE = (
  "<script>window.addEventListener('load', function () {"
  " var t = document.querySelector('article table, main table, table');"
  " var r = t ? t.getBoundingClientRect() : null;"
  " document.body.setAttribute('data-first-table-bottom', r ? String(r.bottom + window.scrollY) : 'none');"
  " document.body.setAttribute('data-first-table-right', r ? String(r.right) : 'none');"
  "});</script>"
)
BOTTOM = re.compile(r'data-first-table-bottom="([^"]+)"')
RIGHT = re.compile(r'data-first-table-right="([^"]+)"')


def _chromium(chromium: str, page: pathlib.Path, *extra: str) -> str:
  command = [
    chromium,
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--hide-scrollbars",
    "--allow-file-access-from-files",
    f"--window-size={WIDTH},{HEIGHT}",
    "--virtual-time-budget=10000",
    *extra,
    page.resolve().as_uri(),
  ]
  return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout


def first_table_edges(chromium: str, page: pathlib.Path) -> tuple[float, float]:
  """(bottom, right) of the page's first table in CSS pixels at the first screen's width."""
  with tempfile.TemporaryDirectory(
    dir=page.parent
  ) as tmp:  # beside the page: its relative links still resolve
    probe = pathlib.Path(tmp).parent / f".{page.stem}_measured.html"
    probe.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    try:
      dom = _chromium(chromium, probe, "--dump-dom")
    finally:
      probe.unlink(missing_ok=True)
  bottom, right = BOTTOM.search(dom), RIGHT.search(dom)
  if bottom is None or bottom.group(1) == "none":
    raise SystemExit(f"check_first_screen: {page} has no table")
  return float(bottom.group(1)), float(right.group(1))


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("site", nargs="?", type=pathlib.Path, default=ROOT / "docs" / "_build" / "html")
  parser.add_argument(
    "--screenshot", type=pathlib.Path, default=None, help="write the first screen here (PNG)"
  )
  args = parser.parse_args(argv)
  chromium = browser()
  if chromium is None:
    print(
      "check_first_screen: no Chromium found (apt-get install chromium, or set CHROMIUM=PATH)",
      file=sys.stderr,
    )
    return 2
  page = args.site / "results.html"
  bottom, right = first_table_edges(chromium, page)
  if args.screenshot is not None:
    args.screenshot.parent.mkdir(parents=True, exist_ok=True)
    _chromium(chromium, page, f"--screenshot={args.screenshot.resolve()}")
  fits = bottom <= HEIGHT and right <= WIDTH
  print(
    f"check_first_screen: the Results page's summary table ends at {bottom:.0f} px down, {right:.0f} px across "
    f"(the first screen: {WIDTH} x {HEIGHT}): {'fits' if fits else 'does not fit'}",
    file=sys.stderr,
  )
  return 0 if fits else 1


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
