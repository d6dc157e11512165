"""Draw a graph without calling any web service.

``draw_mermaid()`` and ``draw_ascii()`` work offline. SVG and PNG come from the ``mermaidx``
package (``pip install 'stitch-graph[draw]'``), which renders the Mermaid text in process; PNG
also comes from pygraphviz where it is installed instead. ``draw`` picks what is installed and
never falls back to LangGraph's default PNG renderer, which sends the graph to a web service.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Literal

DrawFormat = Literal["mermaid", "ascii", "png", "svg"]


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def available_formats() -> list[str]:
    """Formats that can be drawn on this machine."""
    formats = ["mermaid"]
    if _installed("grandalf"):
        formats.append("ascii")
    if _installed("mermaidx"):
        formats += ["png", "svg"]
    elif _installed("pygraphviz"):
        formats.append("png")
    return formats


def draw(
    graph: Any,
    fmt: DrawFormat = "mermaid",
    *,
    path: str | Path | None = None,
    xray: bool | int = True,
) -> str | bytes:
    """Draw ``graph`` (compiled, or a ``StateGraph`` builder) as text or an image.

    Args:
        graph: The graph; a builder is compiled first.
        fmt: ``mermaid`` or ``ascii`` (text), ``svg`` (text) or ``png`` (bytes).
        path: Also write the drawing to this file.
        xray: Expand sub-graphs (a stitch graph nested in a parent shows its agents); an int
            expands that many levels, False draws each sub-graph as one node.

    Returns:
        The drawing: text for ``mermaid``, ``ascii`` and ``svg``, PNG bytes for ``png``.

    Raises:
        RuntimeError: the format needs a renderer that is not installed (the message says which).
    """
    if hasattr(graph, "compile") and not hasattr(graph, "get_graph"):
        graph = graph.compile()
    drawable = graph.get_graph(xray=xray)
    if fmt == "mermaid":
        result: str | bytes = drawable.draw_mermaid(with_styles=False)
    elif fmt == "ascii":
        result = drawable.draw_ascii()
    elif fmt in ("svg", "png") and _installed("mermaidx"):
        import mermaidx

        diagram = mermaidx.render(drawable.draw_mermaid())
        result = diagram.svg() if fmt == "svg" else diagram.png()
    elif fmt == "png" and _installed("pygraphviz"):
        result = drawable.draw_png()
    else:
        msg = (
            f"cannot draw {fmt!r} here: install the renderer with "
            "pip install 'stitch-graph[draw]' (mermaidx: SVG and PNG, no browser or service), "
            f"or pygraphviz for PNG; available formats: {available_formats()}"
        )
        raise RuntimeError(msg)
    if path is not None:
        data = result.encode() if isinstance(result, str) else result
        Path(path).write_bytes(data)
    return result
