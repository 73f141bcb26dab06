"""Sphinx extension: sequence diagrams written as text, drawn by Graphviz at build time.

The directive turns a short text description into Graphviz code with every node pinned
to a computed position (neato layout), and hands it to ``sphinx.ext.graphviz``, so the
diagrams are rendered offline by ``dot`` like every other graph of the site.  Keeping
the description as text keeps the RFC readable as plain Markdown too.

Syntax::

    ```{sequence}
    :caption: Trainable parameter in a checkpointed block
    :name: seq-trainable
    :lanes: eng = Autograd engine; hooks = ZeRO-3 hooks; W = W (trainable)

    == Forward ==
    hooks -> W : fetch_sub_module(forward=True)
    W : AVAILABLE {lin}
    eng --> hooks : reply (dashed)
    hooks .. W : a note across several lanes
    W : ! an error (red)
    W : * a change made by the patch series (bold border)
    ```

``== text ==`` starts a phase (a band across the diagram).  ``A -> B : text`` is a
message (``-->`` dashed), ``A : text`` a note on one lane, ``A .. B : text`` a note
over lanes A to B.  A message or note text that starts with ``!`` is drawn in red (an
error), one that starts with ``*`` in orange (a change made by the patch series).  A note that starts with AVAILABLE, NOT_AVAILABLE, INFLIGHT or HELD
is coloured as a parameter state.  ``\\n`` in a text breaks the line.  Each line of
the description is one row of the diagram, top to bottom.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

# Sizes in inches.  Character width is an estimate for a 10 pt sans-serif font; it only
# sizes the gaps between lanes (Graphviz itself sizes the boxes from real font metrics).
CHAR_W = 0.082
LINE_H = 0.17
MIN_GAP = 1.3
FONT = "Helvetica,Arial,sans-serif"
MESSAGE_WRAP = 22  # characters per line of a message label
NOTE_WRAP = 28  # characters per line of a note

STATE_COLOURS = {
    "NOT_AVAILABLE": ("#ececec", "#777777"),
    "AVAILABLE": ("#d8f0d8", "#2e7d32"),
    "INFLIGHT": ("#fff1c2", "#a07800"),
    "HELD": ("#d6e4ff", "#1f4fa8"),
}


class SequenceSyntaxError(ValueError):
    pass


@dataclass
class Event:
    kind: str  # "phase", "message", "note"
    text: List[str]
    src: int = 0
    dst: int = 0
    dashed: bool = False
    style: str = "plain"  # for notes: plain, error, change, or a state name


@dataclass
class Diagram:
    lanes: List[Tuple[str, str]]  # (key, title)
    events: List[Event] = field(default_factory=list)


def _split_text(text: str, width: int) -> List[str]:
    # Long labels are wrapped so that the diagram stays narrow enough to read without zooming.
    lines = []
    for part in text.split("\\n"):
        lines.extend(textwrap.wrap(part.strip(), width=width, break_long_words=False, break_on_hyphens=False) or [""])
    return lines


def parse_lanes(spec: str) -> List[Tuple[str, str]]:
    lanes = []
    for item in spec.split(";"):
        item = item.strip()
        if not item:
            continue
        if "=" not in item:
            raise SequenceSyntaxError(f"lane {item!r} must be written as key = Title")
        key, title = (s.strip() for s in item.split("=", 1))
        if not re.match(r"^\w+$", key):
            raise SequenceSyntaxError(f"lane key {key!r} must be a word")
        if any(key == k for k, _ in lanes):
            raise SequenceSyntaxError(f"lane {key!r} declared twice")
        lanes.append((key, title))
    if len(lanes) < 2:
        raise SequenceSyntaxError("a sequence diagram needs at least two lanes")
    return lanes


_MESSAGE = re.compile(r"^(\w+)\s*(-->|->)\s*(\w+)\s*:\s*(.+)$")
_SPAN = re.compile(r"^(\w+)\s*\.\.\s*(\w+)\s*:\s*(.+)$")
_NOTE = re.compile(r"^(\w+)\s*:\s*(.+)$")
_PHASE = re.compile(r"^==\s*(.+?)\s*==$")


def parse(lanes_spec: str, lines: List[str]) -> Diagram:
    lanes = parse_lanes(lanes_spec)
    index = {key: i for i, (key, _) in enumerate(lanes)}

    def lane(key: str, lineno: int) -> int:
        if key not in index:
            raise SequenceSyntaxError(f"line {lineno}: unknown lane {key!r} (lanes: {', '.join(index)})")
        return index[key]

    diagram = Diagram(lanes)
    for lineno, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _PHASE.match(line)
        if m:
            diagram.events.append(Event("phase", _split_text(m.group(1), 120)))
            continue
        m = _MESSAGE.match(line)
        if m:
            src, dst = lane(m.group(1), lineno), lane(m.group(3), lineno)
            if src == dst:
                raise SequenceSyntaxError(f"line {lineno}: a message needs two different lanes; use a note")
            text, style = m.group(4).strip(), "plain"
            if text[:1] in ("!", "*"):
                style, text = ("error" if text[0] == "!" else "change"), text[1:].strip()
            diagram.events.append(Event("message", _split_text(text, MESSAGE_WRAP), src, dst,
                                        dashed=m.group(2) == "-->", style=style))
            continue
        m = _SPAN.match(line) or _NOTE.match(line)
        if m:
            if m.re is _SPAN:
                first, last, text = lane(m.group(1), lineno), lane(m.group(2), lineno), m.group(3)
            else:
                first = last = lane(m.group(1), lineno)
                text = m.group(2)
            style = "plain"
            text = text.strip()
            if text.startswith("!"):
                style, text = "error", text[1:].strip()
            elif text.startswith("*"):
                style, text = "change", text[1:].strip()
            else:
                for state in STATE_COLOURS:  # NOT_AVAILABLE is listed before AVAILABLE
                    if text.startswith(state):
                        style = state
                        break
            diagram.events.append(Event("note", _split_text(text, NOTE_WRAP), min(first, last), max(first, last), style=style))
            continue
        raise SequenceSyntaxError(f"line {lineno}: cannot read {line!r}")
    if not diagram.events:
        raise SequenceSyntaxError("the diagram has no rows")
    return diagram


def _quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _label(lines: List[str]) -> str:
    return "\\n".join(_quote(line) for line in lines)


def _text_width(lines: List[str]) -> float:
    return max(len(line) for line in lines) * CHAR_W


def label_gap(ev: Event) -> Tuple[int, int]:
    """The two neighbouring lanes whose gap holds a message's label: the source lane and the next
    lane towards the destination. A label centred over the whole arrow would sit across the
    lifelines of the lanes the arrow passes over."""
    step = 1 if ev.dst > ev.src else -1
    return tuple(sorted((ev.src, ev.src + step)))


def lane_positions(diagram: Diagram) -> List[float]:
    n = len(diagram.lanes)
    gaps = [MIN_GAP] * (n - 1)
    # Lane titles must not touch their neighbours.
    for i in range(n - 1):
        need = (_text_width([diagram.lanes[i][1]]) + _text_width([diagram.lanes[i + 1][1]])) / 2 + 0.4
        gaps[i] = max(gaps[i], need)
    # A message label must fit in the gap next to its source lane (see label_gap).
    for ev in diagram.events:
        if ev.kind != "message":
            continue
        a, b = label_gap(ev)
        gaps[a] = max(gaps[a], _text_width(ev.text) + 0.3)
    xs = [0.0]
    for gap in gaps:
        xs.append(xs[-1] + gap)
    return xs


def to_dot(diagram: Diagram, title: Optional[str] = None) -> str:
    xs = lane_positions(diagram)
    left = xs[0] - 0.9
    right = xs[-1] + 0.9
    out = [
        "digraph sequence {",
        f'  graph [layout=neato, splines=line, outputorder=edgesfirst, overlap=true, pad="0.15", '
        f'fontname="{FONT}"];',
        f'  node [fontname="{FONT}", fontsize=10, margin="0.08,0.03"];',
        f'  edge [fontname="{FONT}", fontsize=10, arrowsize=0.7];',
    ]
    y = 0.0
    # Lane titles, then one row per event going down.
    for i, (key, lane_title) in enumerate(diagram.lanes):
        out.append(f'  "h{i}" [label="{_quote(lane_title)}", shape=box, style="filled,bold", fillcolor="#f4f4f8", '
                   f'color="#555566", pos="{xs[i]:.3f},{y:.3f}!"];')
    y -= 0.45
    for n, ev in enumerate(diagram.events):
        lines = len(ev.text)
        if ev.kind == "phase":
            height = 0.28 + LINE_H * (lines - 1)
            y -= height / 2 + 0.08
            width = right - left
            out.append(f'  "e{n}" [label="{_label(ev.text)}", shape=box, fixedsize=true, width={width:.3f}, '
                       f'height={height:.3f}, style=filled, fillcolor="#e8e8ee", color="#e8e8ee", fontsize=10, '
                       f'pos="{(left + right) / 2:.3f},{y:.3f}!"];')
            y -= height / 2 + 0.14
        elif ev.kind == "message":
            text_h = LINE_H * lines
            label_y = y - text_h / 2
            arrow_y = y - text_h - 0.07
            a, b = xs[ev.src], xs[ev.dst]
            first, second = label_gap(ev)
            out.append(f'  "e{n}" [label="{_label(ev.text)}", shape=plaintext, margin=0, height=0, '
                       f'pos="{(xs[first] + xs[second]) / 2:.3f},{label_y:.3f}!"];')
            out.append(f'  "e{n}s" [shape=point, width=0.04, height=0.04, pos="{a:.3f},{arrow_y:.3f}!"];')
            out.append(f'  "e{n}d" [shape=point, width=0.01, height=0.01, style=invis, pos="{b:.3f},{arrow_y:.3f}!"];')
            style = ', style=dashed' if ev.dashed else ''
            if ev.style == "change":
                style += ', color="#c06000", penwidth=2'
                out[-3] = out[-3].replace("shape=plaintext", 'shape=plaintext, fontcolor="#8a4500"')
            elif ev.style == "error":
                style += ', color="#b00020", penwidth=2'
                out[-3] = out[-3].replace("shape=plaintext", 'shape=plaintext, fontcolor="#800010"')
            out.append(f'  "e{n}s" -> "e{n}d" [arrowhead=vee{style}];')
            y = arrow_y - 0.2
        else:
            height = 0.26 + LINE_H * (lines - 1)
            y -= height / 2
            x = (xs[ev.src] + xs[ev.dst]) / 2
            if ev.style in STATE_COLOURS:
                fill, border = STATE_COLOURS[ev.style]
                attrs = f'style="rounded,filled", fillcolor="{fill}", color="{border}"'
            elif ev.style == "error":
                attrs = 'style="filled,bold", fillcolor="#ffdcdc", color="#b00020", fontcolor="#800010"'
            elif ev.style == "change":
                attrs = 'style="filled,bold", fillcolor="#fff8e0", color="#c06000", penwidth=2'
            else:
                attrs = 'style="filled", fillcolor="#ffffff", color="#999999"'
            width = ""
            if ev.dst != ev.src:
                # a note over several lanes spans them
                width = f", width={xs[ev.dst] - xs[ev.src] + 1.0:.3f}"
            out.append(f'  "e{n}" [label="{_label(ev.text)}", shape=box, {attrs}, height={height:.3f}{width}, '
                       f'pos="{x:.3f},{y:.3f}!"];')
            y -= height / 2 + 0.12
    bottom = y - 0.1
    for i in range(len(diagram.lanes)):
        out.append(f'  "f{i}" [shape=point, width=0.01, height=0.01, style=invis, pos="{xs[i]:.3f},{bottom:.3f}!"];')
        out.append(f'  "h{i}" -> "f{i}" [arrowhead=none, style=dashed, color="#9999aa"];')
    out.append("}")
    return "\n".join(out) + "\n"


def setup(app):
    from docutils.parsers.rst import directives
    from sphinx.ext.graphviz import figure_wrapper, graphviz
    from sphinx.util import logging
    from sphinx.util.docutils import SphinxDirective

    logger = logging.getLogger(__name__)

    class SequenceDirective(SphinxDirective):
        has_content = True
        option_spec = {
            "lanes": directives.unchanged_required,
            "caption": directives.unchanged,
            "alt": directives.unchanged,
            "name": directives.unchanged,
        }

        def run(self):
            if "lanes" not in self.options:
                logger.error("sequence diagram needs a :lanes: option", location=self.get_location())
                return []
            try:
                diagram = parse(self.options["lanes"], list(self.content))
            except SequenceSyntaxError as exc:
                logger.error(f"sequence diagram: {exc}", location=self.get_location())
                return []
            node = graphviz()
            node["code"] = to_dot(diagram)
            current = getattr(self.env, "current_document", None)
            node["options"] = {"docname": current.docname if current is not None else self.env.docname}
            node["alt"] = self.options.get("alt") or self.options.get("caption") or "sequence diagram"
            node["classes"] = ["sequence-diagram"]
            if "caption" in self.options:
                figure = figure_wrapper(self, node, self.options["caption"])
                self.add_name(figure)
                return [figure]
            self.add_name(node)
            return [node]

    app.setup_extension("sphinx.ext.graphviz")
    app.add_directive("sequence", SequenceDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":  # python docs/_ext/sequence.py "a = A; b = B" < rows.txt > out.dot
    import sys

    sys.stdout.write(to_dot(parse(sys.argv[1], sys.stdin.read().splitlines())))
