"""Sphinx configuration of jaxsync's documentation (MyST Markdown pages, autodoc API reference).

Build with ``scripts/docs.sh`` (warnings are errors). Two kinds of page are written here at build time,
into folders that git ignores: the config keys (``_generated/config_keys.md``, from the config
dataclasses) and one page per benchmark result (``benchmarks/results/NAME.md``, each including
``benchmarks/results/NAME.md`` of the repository).
"""

from __future__ import annotations

import os
import pathlib
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # autodoc imports jaxsync; no accelerator is needed

DOCS = pathlib.Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS))

import _pages  # noqa: E402  (docs/_pages.py: the pages written at build time)

import jaxsync  # noqa: E402

project = "jaxsync"
author = "the jaxsync authors"
copyright = "the jaxsync authors, Apache-2.0"
release = version = jaxsync.__version__

extensions = [
  "myst_parser",
  "sphinx.ext.autodoc",
  "sphinx.ext.autosummary",
  "sphinx.ext.napoleon",
  "sphinx.ext.mathjax",
  "sphinx.ext.doctest",
  "sphinx.ext.viewcode",
  # MathJax 3 copied into the site (_static/mathjax/): the math renders with no network.
  "sphinx-mathjax-offline",
]

source_suffix = {".md": "markdown"}
smartquotes_action = "qe"  # curly quotes, but `--out` in prose stays two hyphens (no en dash)
root_doc = "index"
exclude_patterns = ["_build", "_generated", "Thumbs.db", ".DS_Store"]
suppress_warnings: list[str] = []

# -- MyST ---------------------------------------------------------------------------------------------
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 4  # `[text](page.md#a-heading)` links resolve, with GitHub's anchors

# -- API reference ------------------------------------------------------------------------------------
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
# optax's aliases as they are written in the signatures, not expanded into their unions.
autodoc_type_aliases = {
  name: name
  for name in ("optax.ScalarOrSchedule", "optax.Schedule", "optax.Params", "optax.Updates", "optax.OptState")
}
autodoc_default_options = {"show-inheritance": False}
autosummary_generate = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# -- doctest builder: the {doctest} blocks of the pages (the docstrings' own examples run in the suite)
doctest_test_doctest_blocks = ""
doctest_global_setup = "import os\nos.environ.setdefault('JAX_PLATFORMS', 'cpu')"

# -- HTML ---------------------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"jaxsync {release}"
html_static_path = ["_static"]
html_css_files = ["jaxsync.css"]
html_show_sourcelink = False

_pages.write_generated_pages(DOCS, ROOT)


def setup(app):
  app.connect("source-read", _pages.rewrite_links_outside_docs)
