"""One turn of a model-driven agent that may call tools before it answers.

The Coder and the Verifier share this loop: a fresh conversation unless the agent is coming back
from its ``ToolNode``; tool calls while the budget lasts (the output schema is bound as a tool too,
so a model may hand over its answer in the same turn); then a structured answer with bounded,
error-showing retries. The conversation lives in the agent's own message channel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic

from langchain_core.messages import AIMessage, AnyMessage, RemoveMessage, ToolMessage
from langchain_core.tools import BaseTool
from langgraph.graph.message import REMOVE_ALL_MESSAGES

from stitch_graph.agents.context import StitchContext
from stitch_graph.agents.llm import SchemaT, final_answer, structured_call
from stitch_graph.artifacts import AgentFailure


@dataclass
class AgentTurn(Generic[SchemaT]):
    """What one turn produced: messages for the agent's channel and a tool call or an answer."""

    messages: list[AnyMessage] = field(default_factory=list)
    calls_tools: bool = False
    answer: SchemaT | None = None
    failure: AgentFailure | None = None


def _tool_calls_made(messages: Sequence[AnyMessage]) -> int:
    return sum(len(m.tool_calls or []) for m in messages if isinstance(m, AIMessage))


def agent_turn(
    model: Any,
    *,
    agent: str,
    history: Sequence[AnyMessage] | None,
    start: Callable[[], list[AnyMessage]],
    tools: Sequence[BaseTool],
    schema: type[SchemaT],
    ctx: StitchContext,
    closing: str,
) -> AgentTurn[SchemaT]:
    """Run one turn of ``agent``; ``start()`` builds the opening messages of a new conversation."""
    conversation = list(history or [])
    reset: list[AnyMessage] = []
    if not (conversation and isinstance(conversation[-1], ToolMessage)):
        conversation = start()
        reset = [RemoveMessage(id=REMOVE_ALL_MESSAGES), *conversation]
    if _tool_calls_made(conversation) < ctx.max_tool_calls:
        try:
            reply = model.bind_tools([*tools, schema]).invoke(conversation)
        except Exception as exc:  # a provider error skips the tool step, not the run
            reply = AIMessage(content=f"(tool step skipped: {type(exc).__name__}: {exc})")
        answer = final_answer(reply, schema)
        if answer is not None:
            return AgentTurn([*reset, AIMessage(content=closing)], answer=answer)
        names = [c["name"] for c in reply.tool_calls or []]
        if names and schema.__name__ not in names:
            return AgentTurn([*reset, reply], calls_tools=True)
        if reply.content:
            conversation.append(AIMessage(content=reply.content))
    answer, failure = structured_call(
        model,
        schema,
        conversation,
        agent=agent,
        method=ctx.structured_output_method,
        retries=ctx.model_retries,
    )
    text = closing if answer is not None else f"no valid {schema.__name__}"
    return AgentTurn([*reset, AIMessage(content=text)], answer=answer, failure=failure)
