#!/usr/bin/env python3
"""Count the RFC's prose words, body and appendices: python3 rfc/wordcount.py [FILE]
(default: rfc/zero3-parameter-lifecycle.md). The body ends at the first "## Appendix" heading.

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
    path = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "zero3-parameter-lifecycle.md"
    text = path.read_text(encoding="utf-8")
    split = re.search(r"(?m)^## Appendix", text)
    body, appendices = (text[:split.start()], text[split.start():]) if split else (text, "")
    print(f"{path}: body {prose_words(body)} words, appendices {prose_words(appendices)} words")
