"""The whole graph as a building block of larger agent systems.

A compiled stitch graph already takes and returns ``messages`` and carries a ``name``, so it can be
added as a node of a parent graph or handed to a supervisor. ``as_tool`` wraps it as a tool for a
tool-calling agent: the tool takes a KernelBench problem's source and returns the run's summary.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import HumanMessage
from langchain_core.tools import BaseTool, StructuredTool

from stitch_graph.agents.context import StitchContext


def as_tool(
    graph: Any = None,
    *,
    context: StitchContext | None = None,
    name: str = "optimize_with_cuda",
    description: str | None = None,
) -> BaseTool:
    """Wrap a compiled stitch graph (default: a fresh one) as a LangChain tool."""
    if graph is None:
        from stitch_graph.graph import create_stitch_graph

        graph = create_stitch_graph()

    def optimize(problem_source: str) -> str:
        result = graph.invoke(
            {"messages": [HumanMessage(content=f"```python\n{problem_source}\n```")]},
            context=context or StitchContext(),
        )
        report = result.get("report")
        return (
            report.model_dump_json(indent=1)
            if report is not None
            else str(result["messages"][-1].content)
        )

    return StructuredTool.from_function(
        optimize,
        name=name,
        description=description
        or (
            "Turn a PyTorch program into verified CUDA. Input: the source of a KernelBench-style "
            "problem (class Model, get_inputs, get_init_inputs). Output: a JSON report with the "
            "outcome, the best program and its measured speedups."
        ),
    )
