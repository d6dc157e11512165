"""Chat-model plumbing shared by the model-driven agents.

Models arrive per role as an ``init_chat_model`` string or a ``BaseChatModel``. Structured output
goes through ``with_structured_output(..., include_raw=True)`` so a malformed answer is shown back
to the model with its parse error, a bounded number of times, and then becomes an
``AgentFailure`` in state instead of an exception that ends the run.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TypeVar

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from pydantic import BaseModel

from stitch_graph.agents.context import ModelSpec, StructuredMethod
from stitch_graph.artifacts import AgentFailure

SchemaT = TypeVar("SchemaT", bound=BaseModel)


@functools.lru_cache(maxsize=16)
def _init_by_name(name: str) -> BaseChatModel:
    from langchain.chat_models import init_chat_model

    return init_chat_model(name)


def resolve_model(spec: ModelSpec) -> BaseChatModel | None:
    """A chat model for ``spec``: None stays None (rule-based), strings go to init_chat_model.

    Raises:
        ValueError: the string names no provider LangChain knows, or the provider is missing.
    """
    if spec is None or isinstance(spec, BaseChatModel):
        return spec
    try:
        return _init_by_name(spec)
    except Exception as exc:  # provider packages raise many kinds of errors
        msg = (
            f"cannot create chat model {spec!r}: {exc}. Use 'provider:model' "
            "(e.g. 'openai:gpt-4.1'), install the provider's package, set its API key, or pass "
            "a BaseChatModel such as ChatOpenAI(base_url=...) for a local server."
        )
        raise ValueError(msg) from exc


def model_label(model: BaseChatModel | None) -> str:
    """A short name of the model for logs and artefacts (``rules`` when there is none)."""
    if model is None:
        return "rules"
    for attr in ("model_name", "model"):
        value = getattr(model, attr, None)
        if isinstance(value, str) and value:
            return value
    return type(model).__name__


def final_answer(message: AIMessage, schema: type[SchemaT]) -> SchemaT | None:
    """The ``schema`` object if ``message`` calls the schema itself as its (only) tool.

    Agents bind their output schema next to their tools, so a model can hand over its result in
    the same turn as it would call a tool; a call that does not validate returns None and the
    caller falls back to ``structured_call``, which shows the model its error.
    """
    calls = getattr(message, "tool_calls", None) or []
    if len(calls) != 1 or calls[0]["name"] != schema.__name__:
        return None
    try:
        return schema.model_validate(calls[0]["args"])
    except ValueError:
        return None


def structured_call(
    model: BaseChatModel,
    schema: type[SchemaT],
    messages: Sequence[AnyMessage],
    *,
    agent: str,
    method: StructuredMethod = "function_calling",
    retries: int = 2,
) -> tuple[SchemaT | None, AgentFailure | None]:
    """Ask ``model`` for a ``schema`` object, re-asking with the parse error on bad output.

    Returns:
        ``(parsed, None)`` on success, ``(None, failure)`` once ``retries`` re-asks are spent.
    """
    runnable = model.with_structured_output(schema, method=method, include_raw=True)
    conversation = list(messages)
    last_error = "no answer"
    for attempt in range(retries + 1):
        try:
            result = runnable.invoke(conversation)
        except Exception as exc:  # a transport or provider error is a failure, not a crash
            last_error = f"{type(exc).__name__}: {exc}"
            continue
        parsed = result.get("parsed")
        if parsed is not None and result.get("parsing_error") is None:
            return parsed, None
        error = result.get("parsing_error") or "the answer did not contain the structured object"
        last_error = str(error)
        raw = result.get("raw")
        if isinstance(raw, AIMessage):
            conversation.append(AIMessage(content=raw.content or "(malformed structured output)"))
        conversation.append(
            HumanMessage(
                content=(
                    f"Your answer could not be parsed as {schema.__name__} "
                    f"(attempt {attempt + 1} of {retries + 1}): {last_error}\n"
                    f"Answer again with a valid {schema.__name__} object and nothing else."
                )
            )
        )
    failure = AgentFailure(
        agent=agent,
        reason=f"no valid {schema.__name__} after {retries + 1} attempts: {last_error}",
        attempts=retries + 1,
    )
    return None, failure
