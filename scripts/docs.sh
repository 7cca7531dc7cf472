#!/usr/bin/env bash
# Builds the documentation site, then runs the examples of its pages.
#   1. jaxsync and its docs extras (Sphinx, MyST, furo, MathJax for offline math) into the active
#      Python environment;
#   2. the HTML site in docs/_build/html/ (open index.html), every warning an error (-W), all of
#      them reported before it fails (--keep-going);
#   3. the doctest builder: the {doctest} blocks of the pages under docs/ (the docstrings' own
#      examples run in the test suite, tests/test_public_api.py);
#   4. every page with math rendered in headless Chromium (scripts/check_math.py): a MathJax error
#      ("Misplaced &") shows only in a browser, never in the build. Chromium comes from Debian's
#      package, installed with apt-get when this runs as root or with password-less sudo;
#   5. the Results page at 1,280 x 800 px in the same browser (scripts/check_first_screen.py): its summary
#      table of verdicts must end within the first screen; the screenshot is docs/_build/results_1280.png.
# Extra arguments go to both sphinx-build runs (scripts/docs.sh -E rebuilds from scratch).
set -euo pipefail
cd "$(dirname "$0")/.."
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"

python -m pip install -q -e '.[docs]'
python -m sphinx -W --keep-going -b html "$@" docs docs/_build/html
python -m sphinx -W --keep-going -b doctest "$@" docs docs/_build/doctest

if ! command -v chromium >/dev/null && command -v apt-get >/dev/null; then
  as_root=()
  if [ "$(id -u)" != 0 ] && sudo -n true 2>/dev/null; then as_root=(sudo -n); fi
  if [ "$(id -u)" = 0 ] || [ ${#as_root[@]} -gt 0 ]; then
    "${as_root[@]}" apt-get install -y -q chromium >/dev/null \
      || { "${as_root[@]}" apt-get update -q >/dev/null && "${as_root[@]}" apt-get install -y -q chromium >/dev/null; }
  fi
fi
python scripts/check_math.py docs/_build/html
python scripts/check_first_screen.py docs/_build/html --screenshot docs/_build/results_1280.png
echo "docs.sh: the site is in docs/_build/html/index.html"
