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
# ({path relative to generated_dir: why}.)
_GPU_BENCH_V0192 = ("the GPU benchmark (one H200), measured on series-8; series-14 adds 0008, which skips "
                    "ZeRO-3's backward-hook wrapping while grad is disabled, 0009, which keeps more only when a "
                    "recompute without early stop runs inside a module's own backward, 0010, 0011 and 0013, which "
                    "change only models with z3 leaf modules, 0012, which changes only a module that returns its "
                    "own parameter, and 0007's cases of an input whose grad never comes and of a released external "
                    "parameter; the benchmark's models run no ZeRO-3 module under torch.no_grad (the reentrant "
                    "variant runs pristine v0.19.2), keep torch's default early stop, have no z3 leaf modules, "
                    "return no parameter and use every input")
_GPU_BENCH_V0198 = ("the GPU benchmark (one H200), measured on the follow-up before PRs 7 to 11, the same changes "
                    "as 0008, 0009, 0011, 0012 and 0013 of the v0.19.2 series; the benchmark's model runs no "
                    "ZeRO-3 module under torch.no_grad, keeps torch's default early stop, has no z3 leaf modules "
                    "and returns no parameter")
_CPU_SERIES_20 = ("measured on the 20-patch series (cb45bc23b0fe); the series now also has 0020, which looks up a "
                  "module's backward functions in its own __dict__ when ZeRO-3 registers its hooks, and 0021, which "
                  "waits on every all-gather of a gather of several parameters at once (GatheredParameters of a "
                  "list), not the fetches these runs measure")
generated_historical = {
    "cpu-bookkeeping.md": _CPU_SERIES_20,
    "host-overhead.md": _CPU_SERIES_20,
    "host-overhead-runs/": _CPU_SERIES_20,
    "bench.md": _GPU_BENCH_V0192,
    "bench.png": _GPU_BENCH_V0192,
    "bench-runs/batch4/": _GPU_BENCH_V0192,
    "bench-followup-v0.19.8.md": _GPU_BENCH_V0198,
    "bench-followup-v0.19.8.png": _GPU_BENCH_V0198,
    # the follow-up's runs, and the floor and v0.19.8 runs of the same bench (stamped with series-8)
    "bench-runs/followup-v0.19.8/": _GPU_BENCH_V0198,
}

html_theme = "furo"
html_title = "zero3-frozen-ckpt"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
html_last_updated_fmt = None
html_show_sourcelink = False
html_copy_source = False
# furo would otherwise link its "edit"/"view" buttons nowhere useful; the site must work offline.
html_theme_options = {"top_of_page_buttons": []}
