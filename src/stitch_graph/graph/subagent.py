"""The whole graph as a building block of larger agent systems.

The contract a parent graph or supervisor can rely on, pinned by tests:

- the compiled graph is named ``stitch_graph`` (``create_stitch_graph(name=...)`` changes it);
- it takes ``messages`` (the problem's source in the last human message) or a ``task``;
- it returns ``messages``, ``report`` and ``result``: the last message is an AI message named
  ``stitch_graph`` whose text is the run's summary and whose
  ``additional_kwargs["stitch_result"]`` is ``result``, plain JSON data (outcome, partial, the
  program's files and sources, correctness, speedups against eager and ``torch.compile``, ops
  left to PyTorch with their call sites), so no one has to parse the summary.

``as_tool`` wraps the graph as a tool for a tool-calling agent (for instance
``langchain.agents.create_agent``): the tool takes a problem's source and answers with the result
as JSON; the ``ToolMessage``'s ``artifact`` holds the same dict with the program's sources.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import BaseTool, StructuredTool

from stitch_graph.agents.context import StitchContext
from stitch_graph.agents.finalize import GRAPH_NAME, RESULT_KEY

__all__ = ["GRAPH_NAME", "RESULT_KEY", "as_tool", "result_of"]


def result_of(output: dict[str, Any] | BaseMessage) -> dict[str, Any] | None:
    """The structured result of a run, from the graph's output or from its closing message.

    Args:
        output: What the graph returned (or a parent's state holding its messages), or the
            closing AI message itself.

    Returns:
        The result dict, or None when no closing message of a stitch graph is there.
    """
    if isinstance(output, BaseMessage):
        return output.additional_kwargs.get(RESULT_KEY)
    if output.get("result") is not None:
        return output["result"]
    for message in reversed(output.get("messages", [])):
        if isinstance(message, AIMessage) and RESULT_KEY in message.additional_kwargs:
            return message.additional_kwargs[RESULT_KEY]
    return None


def as_tool(
    graph: Any = None,
    *,
    context: StitchContext | None = None,
    name: str = "optimize_with_cuda",
    description: str | None = None,
    run_dir: str | Path | None = None,
) -> BaseTool:
    """Wrap a compiled stitch graph (default: a fresh one) as a LangChain tool.

    Args:
        graph: The compiled graph; a fresh ``create_stitch_graph()`` when None.
        context: Run settings for every call (default: rule-based agents).
        name: The tool's name, as the calling model sees it.
        description: The tool's description; the default says what goes in and comes out.
        run_dir: When given, each call writes its run folder under it (``call-1``, ...), and
            the result names the program's files there.

    Returns:
        A tool whose answer is the run's result as JSON without the program's sources (the
        files or the artifact have them); the artifact is the full result dict.
    """
    if graph is None:
        from stitch_graph.graph import create_stitch_graph

        graph = create_stitch_graph()
    calls = itertools.count(1)

    def optimize(problem_source: str) -> tuple[str, dict[str, Any] | None]:
        ctx = context or StitchContext()
        if run_dir is not None:
            ctx = ctx.with_overrides(run_dir=str(Path(run_dir) / f"call-{next(calls)}"))
        output = graph.invoke(
            {"messages": [HumanMessage(content=f"```python\n{problem_source}\n```")]},
            context=ctx,
        )
        result = result_of(output)
        if result is None:
            return str(output["messages"][-1].content), None
        brief = {k: v for k, v in result.items() if k != "program"}
        return json.dumps(brief, indent=1), result

    return StructuredTool.from_function(
        optimize,
        name=name,
        response_format="content_and_artifact",
        description=description
        or (
            "Turn a PyTorch program into verified CUDA. Input: the source of a KernelBench-style "
            "problem (class Model, get_inputs, get_init_inputs). Output: JSON with the outcome "
            "(verified, partial, compiled_only, unsupported, no_program, failed), whether the "
            "program is partial, its files, correctness, speedups against PyTorch eager and "
            "torch.compile, and the ops left to PyTorch."
        ),
    )
