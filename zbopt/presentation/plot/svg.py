"""A figure as inline SVG, for HTML: the report's charts and a notebook's view of a result."""

from __future__ import annotations

import io
import re

import matplotlib
import matplotlib.pyplot as plt

# text as text (a fraction of the size of glyph paths); where DejaVu Sans (what the labels were
# measured with) is missing, the browser falls back to narrower fonts, so fitted labels still fit
SVG_TEXT = {"svg.fonttype": "none", "font.sans-serif": ["DejaVu Sans", "Arial", "Helvetica"]}


def figure_html(kind: str, figure) -> str:
    """The figure as an inline SVG in a <figure class=kind>, and closed (a report draws many)."""
    buffer = io.StringIO()
    with matplotlib.rc_context(SVG_TEXT):
        figure.savefig(buffer, format="svg")
    plt.close(figure)
    svg = buffer.getvalue()
    svg = svg[svg.index("<svg"):]  # drop the XML prolog and the DTD, which names a URL
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.DOTALL)  # and the RDF metadata, which do too
    return f'<figure class="{kind}">\n{svg}</figure>'
