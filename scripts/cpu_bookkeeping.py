#!/usr/bin/env python3
"""Compare what DeepSpeed trees leave behind in the series' scenarios, on CPU with 2 ranks.

    python scripts/cpu_bookkeeping.py LABEL=TREE[+minimal-skip] ... --md docs/_generated/cpu-bookkeeping.md

Each TREE is a DeepSpeed source tree (its deepspeed/ package is imported by the ranks through
PYTHONPATH); "+minimal-skip" emulates DeepSpeed PR #8130 on top of that tree. Every measurement
runs in each tree: a crash is a result. Writes a Markdown table for the RFC. The RFC's table was
made with build/deepspeed-v0.19.2-pristine (scripts/apply.sh v0.19.2 --pristine --dest ...),
build/deepspeed-v0.19.2 (the series) and the upstream 0.19.3 sdist, unpacked from
`pip download --no-deps --no-binary :all: deepspeed==0.19.3` (sha256 82b4b92d0cd58f8f...ed2f).
"""

import argparse
import os
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variants", nargs="+", metavar="LABEL=TREE[+minimal-skip]")
    parser.add_argument("--md", required=True)
    args = parser.parse_args()
    # each tree needs rank processes of its own: no zygote shared across trees
    os.environ["ZERO3_TEST_FORK"] = "0"
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from tests.harness import RankPool

    columns = []
    for spec in args.variants:
        label, sep, tree = spec.partition("=")
        minimal_skip = tree.endswith("+minimal-skip")
        tree = tree.removesuffix("+minimal-skip")
        if not sep or not (Path(tree) / "deepspeed" / "__init__.py").is_file():
            sys.exit(f"cpu_bookkeeping.py: {spec!r}: expected LABEL=TREE with TREE a DeepSpeed source tree")
        pool = RankPool(2, env={"PYTHONPATH": str(Path(tree).resolve())}, name=label)
        try:
            result = pool.run("tests.scenarios.bookkeeping:measure", minimal_skip=minimal_skip, timeout=900)[0]
        finally:
            pool.close()
        columns.append((label, result))
        print(f"{label}: {result}")

    rows = [key for key in columns[0][1] if key != "version"]
    lines = ["| measurement | " + " | ".join(f"{label} ({r['version'].strip()})" for label, r in columns) + " |"]
    lines.append("|---" * (len(columns) + 1) + "|")
    for row in rows:
        cells = []
        for _, result in columns:
            value = result[row]
            if isinstance(value, dict):
                value = ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in value.items())
            cells.append(str(value))
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "CPU, 2 ranks (gloo), torch 2.13.0, ZeRO-3 with prefetch bucket 0, reuse distance 0 and "
        "persistence threshold 0; produced by `scripts/cpu_bookkeeping.py` from "
        "`tests/scenarios/bookkeeping.py`. Peaks count frozen parameters gathered at once during "
        "backward, out of all frozen parameters (a block holds 2).",
    ]
    # the stamp: the series of this checkout (its tree is the one labelled series), and every tree
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    import stamps
    versions = sorted({r["version"].strip() for _, r in columns})
    stamp = stamps.make(ROOT / "patches" / "v0.19.2", ", ".join(versions), [label for label, _ in columns],
                        "python scripts/cpu_bookkeeping.py " + " ".join(shlex.quote(v) for v in args.variants) +
                        f" --md {args.md}")
    Path(args.md).write_text(stamps.stamp_markdown("\n".join(lines) + "\n", stamp))
    print(f"wrote {args.md}")


if __name__ == "__main__":
    main()
