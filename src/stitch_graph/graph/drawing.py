"""Draw a graph without calling any web service.

``draw_mermaid()`` and ``draw_ascii()`` work offline; PNG needs pygraphviz (with Graphviz) and
SVG/PNG from Mermaid need the ``mermaidx`` package. ``draw`` picks what is installed and never
falls back to LangGraph's default renderer, which calls a web service.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Literal

DrawFormat = Literal["mermaid", "ascii", "png", "svg"]


def available_formats() -> list[str]:
    """Formats that can be drawn on this machine."""
    formats = ["mermaid"]
    if importlib.util.find_spec("grandalf"):
        formats.append("ascii")
    if importlib.util.find_spec("pygraphviz"):
        formats.append("png")
    if importlib.util.find_spec("mermaidx"):
        formats += ["svg"] if "png" in formats else ["svg", "png"]
    return formats


def draw(graph: Any, fmt: DrawFormat = "mermaid", *, path: str | Path | None = None) -> str | bytes:
    """Draw ``graph`` (compiled, or a ``StateGraph`` builder) as text or an image.

    Raises:
        RuntimeError: the format needs a renderer that is not installed (the message says which).
    """
    if hasattr(graph, "compile") and not hasattr(graph, "get_graph"):
        graph = graph.compile()
    drawable = graph.get_graph(xray=True)
    if fmt == "mermaid":
        result: str | bytes = drawable.draw_mermaid(with_styles=False)
    elif fmt == "ascii":
        result = drawable.draw_ascii()
    elif fmt == "png" and importlib.util.find_spec("pygraphviz"):
        result = drawable.draw_png()
    elif fmt in ("svg", "png") and importlib.util.find_spec("mermaidx"):
        import mermaidx

        render = getattr(mermaidx, f"render_{fmt}", None) or getattr(mermaidx, "render")
        result = render(drawable.draw_mermaid())
    else:
        msg = (
            f"cannot draw {fmt!r} here: install pygraphviz (and Graphviz) for PNG or mermaidx "
            f"for SVG/PNG; available formats: {available_formats()}"
        )
        raise RuntimeError(msg)
    if path is not None:
        data = result.encode() if isinstance(result, str) else result
        Path(path).write_bytes(data)
    return result
