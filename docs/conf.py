"""Sphinx configuration of the zero3-frozen-ckpt documentation site.

Build: sphinx-build -W --keep-going -b html docs docs/_build/html
Everything is rendered locally (Graphviz `dot` for diagrams, no CDN assets), so the
build and the pages work offline.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "_ext"))

project = "zero3-frozen-ckpt"
author = "The zero3-frozen-ckpt maintainers"
copyright = "2026, The zero3-frozen-ckpt maintainers"

extensions = [
    "myst_parser",
    "sphinx.ext.graphviz",
    "invariants",
    "sequence",
    "diagram_links",
    "tables",
    "generated",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
# generated fragments are included by the pages that show them, not built as pages
exclude_patterns = ["_build", "_generated/*.md", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# Diagrams: SVG, drawn by the local `dot` at build time.
graphviz_output_format = "svg"

# Invariants: the RFC declares them, tests claim them (see _ext/invariants.py).
invariants_root = ".."
invariants_test_globs = ["tests/**/*.py"]
invariants_patch_globs = ["patches/v0.19.2/[0-9]*.patch"]
invariants_require_tests = True
# The tests of each invariant are listed once, on the test-matrix page; the RFC links there.
invariants_tests_page = "test-matrix"

# Measured inputs (see _generated/README.md). Each carries a stamp of the series revision it
# measured; the build fails when one differs from patches/ now (docs/_ext/stamps.py), except for
# the inputs below, which the page labels, beside them, with the revision they measured.
generated_dir = "_generated"
# ({path relative to generated_dir: why}; every input is current today.)
generated_historical = {}

html_theme = "furo"
html_title = "zero3-frozen-ckpt"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
html_last_updated_fmt = None
html_show_sourcelink = False
html_copy_source = False
# furo would otherwise link its "edit"/"view" buttons nowhere useful; the site must work offline.
html_theme_options = {"top_of_page_buttons": []}
