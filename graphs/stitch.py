"""The default stitch graph, for LangGraph Studio / ``langgraph dev`` (see ``langgraph.json``)."""

from stitch_graph import create_stitch_graph

graph = create_stitch_graph()
