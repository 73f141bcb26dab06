"""Sphinx extension: a Markdown table whose header row is empty renders without one.

A pipe table needs a header row, so a key/value table (the RFC's front matter: Title, Authors,
Status, ...) is written with an empty one, `| | |`. Rendered as is, it starts with a blank row
of header cells; this drops a table head whose cells hold no text.
"""

from docutils import nodes


def drop_empty_heads(app, doctree, docname):
    for head in list(doctree.findall(nodes.thead)):
        if not head.astext().strip():
            head.parent.remove(head)


def setup(app):
    app.connect("doctree-resolved", drop_empty_heads)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
