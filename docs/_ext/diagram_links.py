"""Sphinx extension: a "full-size diagram" link under every Graphviz SVG.

sphinx.ext.graphviz embeds an SVG in an <object> that the page scales to the column (or, on
a narrow screen, scrolls). The link opens the SVG itself, at its drawn size, where every label
can be read and zoomed. The diagram is rendered by sphinx.ext.graphviz unchanged; only the
link is appended after its <div class="graphviz">.
"""

import html
import re

_OBJECT = re.compile(r'<object data="([^"]+\.svg)"')


def setup(app):
    from docutils import nodes
    from sphinx.ext.graphviz import graphviz, html_visit_graphviz

    def visit(self, node):
        start = len(self.body)
        try:
            html_visit_graphviz(self, node)
        except nodes.SkipNode:
            for chunk in self.body[start:]:
                match = _OBJECT.search(chunk)
                if match:
                    self.body.append(f'<p class="diagram-full-size"><a class="reference external" '
                                     f'href="{html.escape(match.group(1))}">Full-size diagram (SVG)</a></p>\n')
                    break
            raise

    app.setup_extension("sphinx.ext.graphviz")
    app.add_node(graphviz, override=True, html=(visit, None))
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
