"""The ``stitch-graph`` command line: optimise a problem, draw the graph, search the knowledge
index, export training data. It sits above every library layer and nothing imports it."""

from stitch_graph.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
