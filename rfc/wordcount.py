#!/usr/bin/env python3
"""Count the RFC's words, body and appendices: python3 rfc/wordcount.py [FILE]
(default: rfc/zero3-parameter-lifecycle.md). The body ends at the first "## Appendix" heading.
tests/test_docs.py holds the limits, on the prose counts: body <= 5,000 words, in all <= 12,000.

Two counts for each part:

- prose: fenced blocks are dropped (code, sequence and graphviz diagrams, generated tables)
  except the bodies of {invariant} blocks, which are prose; directive options (":caption: ...")
  are dropped; Markdown table separator rows are dropped and cell text is counted without the
  pipes;
- as rendered: prose plus what the built page shows in its place as text: code blocks, the
  Markdown files that {generated} blocks include from docs/_generated/ (without their stamp
  comment), and the "Checked by: N tests." line under each invariant (4 words). Diagrams and
  images are figures and are not counted.

A word is a run of non-space characters.
"""

import pathlib
import re
import sys

HERE = pathlib.Path(__file__).resolve().parent
GENERATED = HERE.parent / "docs" / "_generated"
PROSE_BLOCKS = {"{invariant}"}
CHECKED_BY_WORDS = 4


def _table_free(lines):
    return [line.replace("|", " ") for line in lines if not re.match(r"^\s*\|?\s*:?-{3,}", line)]


def words(text, rendered=False):
    kept, fence, kind = [], None, None
    for line in text.splitlines():
        opening = re.match(r"^(`{3,})(\S*)\s*(.*)$", line)
        if fence is None and opening:
            fence, kind = opening.group(1), opening.group(2)
            if rendered and kind == "{generated}" and opening.group(3).endswith(".md"):
                included = (GENERATED / opening.group(3)).read_text(encoding="utf-8")
                kept += _table_free(re.sub(r"^<!--.*?-->\n", "", included).splitlines())
            if rendered and kind == "{invariant}":
                kept.append("w " * CHECKED_BY_WORDS)
            continue
        if fence is not None:
            if line.strip() == fence:
                fence = None
            elif line.startswith(":"):
                pass
            elif kind in PROSE_BLOCKS or (rendered and not kind.startswith("{")):  # prose, or code
                kept.append(line)
            continue
        kept += _table_free([line])
    return len(" ".join(kept).split())


def split(text):
    """The body (up to the first "## Appendix" heading) and the appendices."""
    start = re.search(r"(?m)^## Appendix", text)
    return (text[:start.start()], text[start.start():]) if start else (text, "")


if __name__ == "__main__":
    path = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "zero3-parameter-lifecycle.md"
    body, appendices = split(path.read_text(encoding="utf-8"))
    print(f"{path}: body {words(body)} words of prose, {words(body, rendered=True)} as rendered; "
          f"appendices {words(appendices)} of prose, {words(appendices, rendered=True)} as rendered; "
          f"in all {words(body) + words(appendices)} of prose (tests/test_docs.py: body <= 5000, in all <= 12000)")
