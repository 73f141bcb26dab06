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
# ({path relative to generated_dir: why}.) The note above such an input gives the revision it
# measured and the series' size then and now (docs/_ext/generated.py); the reason says why it was
# not measured again, so that it does not go stale as patches are added.
_GPU_BENCH_V0192 = ("The GPU benchmark (one H200) has not been run on the current series: it needs a GPU, "
                    "and the runs since then went to the test suite")
_GPU_BENCH_V0198 = ("The GPU benchmark (one H200) has not been run on the current follow-up: it needs a GPU, "
                    "and the runs since then went to the test suite and to the batches' GPU paths")
_CPU_SERIES_20 = "These CPU measurements have not been run on the current series"
_GPU_WS1_B4 = ("Separate runs at batch 4 on one GPU of the series two revisions back (before a graph run a second "
               "time gathered again, and before 0025); later paired runs at batch 4 are in bench-pair-ws1-v0.19.2.md")
_GPU_WS1_PRISTINE = ("Runs of pristine DeepSpeed (the reentrant workaround on v0.19.2, and v0.19.8), stamped with the "
                     "v0.19.2 series of the call that made them: no patch of the series is in what they measure")
_GPU_SERIES_24 = ("Measured on one H100 with the series one revision back (before 0025 made the module hooks' "
                  "autograd functions take ctx in forward); no GPU was lent since to measure the current series")
_TRACE_SERIES_24 = ("The trace that located the series' host time, made one revision back (before 0025); no GPU was "
                    "lent since to trace the current series")
_UPSTREAM_SERIES_24 = ("Upstream's suite on the series one revision back (before 0025): at LOCAL_SIZE=2 it takes "
                       "over an hour of CPU per tree, and has not been run again on the current series")
_GPU_FOLLOWUP_16 = ("Measured on a one-GPU host with the follow-up one revision back (before 0017 made the module hooks' "
                    "autograd functions take ctx in forward); no GPU has been lent since to measure the current follow-up")
_GPU_V0198_PRISTINE = ("A run of pristine v0.19.8, stamped with the follow-up of the call that made it (one revision "
                       "back): no patch of the follow-up is in what it measures")
_UPSTREAM_FOLLOWUP_16 = ("Upstream's suite on the follow-up one revision back (before 0017): at LOCAL_SIZE=2 it takes "
                         "hours of CPU per tree; with 0017, CI's scripts/prove_batches.py runs upstream's tests of the "
                         "two files the follow-up extends, with each batch and with the whole follow-up")
generated_historical = {
    "upstream-cpu-v0.19.2.md": _UPSTREAM_SERIES_24,
    "bench-pair-ws1-v0.19.2.md": _GPU_SERIES_24,
    "bench-runs/ws1-h100-pair/": _GPU_SERIES_24,
    "no-frozen-overhead-gpu-v0.19.2.md": _GPU_SERIES_24,
    "trace-ws1.md": _TRACE_SERIES_24,
    **{f"bench-runs/trace-h100/trace_{run}.json": _TRACE_SERIES_24
       for run in ("1-torch-reentrant", "2-torch-nonreentrant", "3-v0192-reentrant", "4-v0192-series")},
    "bench-runs/trace-h100/trace_5-v0198-pristine.json": _GPU_V0198_PRISTINE,
    "bench-runs/trace-h100/trace_6-v0198-followup.json": _GPU_FOLLOWUP_16,
    "bench-ws1-v0.19.8.md": _GPU_FOLLOWUP_16,
    **{f"bench-runs/ws1-h200/b4-v0198-followup-{n}.json": _GPU_FOLLOWUP_16 for n in (1, 2, 3)},
    "gpu-paths-v0.19.8.md": _GPU_FOLLOWUP_16,
    "no-frozen-overhead-v0.19.8.md": _GPU_FOLLOWUP_16,
    "upstream-cuda-ws1-v0.19.8.md": _GPU_FOLLOWUP_16,
    "upstream-cpu-v0.19.8.md": _UPSTREAM_FOLLOWUP_16,
    "trace-ws1-b16.md": _TRACE_SERIES_24,
    "bench-runs/trace-h100-b16/": _TRACE_SERIES_24,
    "cpu-bookkeeping.md": _CPU_SERIES_20,
    "bench.md": _GPU_BENCH_V0192,
    "bench.png": _GPU_BENCH_V0192,
    "bench-runs/batch4/": _GPU_BENCH_V0192,
    "bench-followup-v0.19.8.md": _GPU_BENCH_V0198,
    "bench-followup-v0.19.8.png": _GPU_BENCH_V0198,
    # the follow-up's runs, and the floor and v0.19.8 runs of the same bench (stamped with series-8)
    "bench-runs/followup-v0.19.8/": _GPU_BENCH_V0198,
    "bench-ws1-v0.19.2.md": _GPU_WS1_B4,
    **{f"bench-runs/ws1-h100/b4-{tree}-{n}.json": _GPU_WS1_B4 for tree in ("v0192-pristine", "v0192-series") for n in (1, 2, 3)},
    # the H200 runs that bench-ws1-v0.19.8.md reads besides the follow-up's (which carry the v0.19.8 stamp)
    **{
        f"bench-runs/ws1-h200/b4-{tree}-{n}.json": _GPU_WS1_PRISTINE
        for tree in ("v0192-pristine", "v0198-pristine") for n in (1, 2, 3)
    },
}

html_theme = "furo"
html_title = "zero3-frozen-ckpt"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
# wide tables, diagrams and charts get a scroll cue over their edge (see custom.css)
html_js_files = ["scroll-cue.js"]
html_last_updated_fmt = None
html_show_sourcelink = False
html_copy_source = False
# furo would otherwise link its "edit"/"view" buttons nowhere useful; the site must work offline.
html_theme_options = {"top_of_page_buttons": []}
