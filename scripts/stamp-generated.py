#!/usr/bin/env python3
"""Stamp generated inputs in docs/_generated/ with the series revision and DeepSpeed they measured.

The scripts that produce inputs stamp them themselves; this stamps an input whose producer ran
before stamps existed, or on another machine (a GPU host), from what is known about that run:

    python scripts/stamp-generated.py --patches-at e765c65:patches --series v0.19.2 \\
        --deepspeed 0.19.2 --trees "v0.19.2 + series, v0.19.2, 0.19.8" \\
        --command "tox -e bench (2 GPUs), then scripts/bench_lifecycle.py --report" docs/_generated/bench.md

--patches-at COMMIT:DIR reads the series as it was committed (git show COMMIT:DIR/series and its
patches); without it the series is patches/SERIES as it is now. --show prints the stamps of the
given files and the current series id, and changes nothing.
"""

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import stamps  # noqa: E402


def series_at(spec):
    """(patch count, series id) of the series committed at COMMIT:DIR."""
    commit, _, directory = spec.partition(":")
    if not commit or not directory:
        sys.exit(f"stamp-generated.py: --patches-at wants COMMIT:DIR, got {spec!r}")

    def show(path):
        run = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{directory}/{path}"], capture_output=True,
                             text=True)
        if run.returncode:
            sys.exit(f"stamp-generated.py: cannot read {directory}/{path} at {commit}: {run.stderr.strip()}")
        return run.stdout

    names = [line.split("#", 1)[0].strip() for line in show("series").splitlines()]
    names = [n for n in names if n]
    return len(names), stamps.series_id_of([show(n) for n in names])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--series", default="v0.19.2", help="series directory under patches/ (default v0.19.2)")
    parser.add_argument("--patches-at", metavar="COMMIT:DIR")
    parser.add_argument("--deepspeed", help="the DeepSpeed release(s) measured, e.g. 0.19.2")
    parser.add_argument("--trees", help="comma-separated names of the trees the input compares")
    parser.add_argument("--command", help="the command that regenerates the input")
    parser.add_argument("--show", action="store_true")
    args = parser.parse_args()

    if args.show:
        print(f"current series {args.series}: {stamps.series_id(ROOT / 'patches' / args.series)}")
        for path in args.files:
            print(f"{path}: {stamps.read(path)}")
        return
    missing = [f"--{name}" for name in ("deepspeed", "trees", "command") if not getattr(args, name)]
    if missing:
        sys.exit(f"stamp-generated.py: {', '.join(missing)} required (see --help)")
    if args.patches_at:
        count, sid = series_at(args.patches_at)
    else:
        patch_dir = ROOT / "patches" / args.series
        count, sid = len(stamps.series_patches(patch_dir)), stamps.series_id(patch_dir)
    stamp = {
        "series": args.series,
        "series_id": sid,
        "patches": count,
        "deepspeed": args.deepspeed,
        "trees": [t.strip() for t in args.trees.split(",") if t.strip()],
        "command": args.command,
    }
    for path in args.files:
        stamps.write(path, stamp)
        print(f"stamped {path}: series {args.series} at {sid} ({count} patches), DeepSpeed {args.deepspeed}")


if __name__ == "__main__":
    main()
