#!/usr/bin/env python3
"""Count the RFC's prose words: python3 rfc/wordcount.py [FILE ...] (default: the RFC and its appendices).

Fenced blocks are dropped (code, sequence and graphviz diagrams, generated tables) except the
bodies of {invariant} blocks, which are prose; directive options (":caption: ...") are dropped;
Markdown table separator rows are dropped and cell text is counted without the pipes. A word is
a run of non-space characters.
"""

import pathlib
import re
import sys

HERE = pathlib.Path(__file__).resolve().parent
PROSE_BLOCKS = {"{invariant}"}


def prose_words(text):
    kept, fence, prose = [], None, False
    for line in text.splitlines():
        opening = re.match(r"^(`{3,})(\S*)", line)
        if fence is None and opening:
            fence, prose = opening.group(1), opening.group(2) in PROSE_BLOCKS
            continue
        if fence is not None:
            if line.strip() == fence:
                fence = None
            elif prose and not line.startswith(":"):
                kept.append(line)
            continue
        if re.match(r"^\s*\|?\s*:?-{3,}", line):
            continue
        kept.append(line.replace("|", " "))
    return len(" ".join(kept).split())


if __name__ == "__main__":
    paths = sys.argv[1:] or [HERE / "zero3-parameter-lifecycle.md", HERE / "appendices.md"]
    for path in paths:
        print(f"{prose_words(pathlib.Path(path).read_text(encoding='utf-8')):6d}  {path}")
