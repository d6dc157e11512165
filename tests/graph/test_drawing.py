"""Drawing offline: Mermaid text, SVG and PNG through the ``draw`` extra, sub-graphs expanded."""

from __future__ import annotations

import pytest
from langgraph.graph import START, MessagesState, StateGraph

from stitch_graph import create_stitch_graph, draw
from stitch_graph.graph import drawing
from stitch_graph.graph.drawing import available_formats

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def parent_graph():
    """A parent graph with the stitch graph as one of its nodes."""
    parent = StateGraph(MessagesState)
    parent.add_node("cuda_team", create_stitch_graph())
    parent.add_edge(START, "cuda_team")
    return parent.compile()


def test_the_draw_extra_gives_png_and_svg():
    assert {"mermaid", "ascii", "png", "svg"} <= set(available_formats())


def test_png_and_svg_of_a_nested_graph_with_its_agents_expanded(tmp_path):
    png = draw(parent_graph(), "png", path=tmp_path / "team.png")
    assert isinstance(png, bytes) and png.startswith(PNG_MAGIC) and len(png) > 10_000
    assert (tmp_path / "team.png").read_bytes() == png
    svg = draw(create_stitch_graph(), "svg")
    assert svg.lstrip().startswith("<svg")
    for node in ("planner", "coder_tools", "verifier_tools", "finalize"):
        assert node in svg


def test_sub_graphs_are_expanded_or_collapsed_on_request():
    expanded = draw(parent_graph(), "mermaid")
    assert "subgraph cuda_team" in expanded and "cuda_team\\3averifier_tools" in expanded
    collapsed = draw(parent_graph(), "mermaid", xray=False)
    assert "planner" not in collapsed and "__start__ --> cuda_team;" in collapsed


def test_without_a_renderer_the_error_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setattr(drawing, "_installed", lambda module: module == "grandalf")
    assert available_formats() == ["mermaid", "ascii"]
    with pytest.raises(RuntimeError, match=r"pip install 'stitch-graph\[draw\]'"):
        draw(create_stitch_graph(), "png", path=tmp_path / "g.png")
    assert not (tmp_path / "g.png").exists()
