"""The Markdown report of a run, for the command line; it lives with the run-folder writer."""

from stitch_graph.agents.run_folder import render_markdown

__all__ = ["render_markdown"]
