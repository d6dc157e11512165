"""Find the task of a run: given directly, as a path, or as problem source in a message.

The last lets the whole graph serve as a sub-agent that takes only ``messages``.
"""

from __future__ import annotations

import re

from stitch_graph.agents.state import StitchState
from stitch_graph.artifacts import AgentFailure, Task

_CODE_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.S)


def problem_source_from_text(text: str) -> str | None:
    """The KernelBench problem in ``text``: a fenced code block defining Model, or the text."""
    for block in _CODE_BLOCK.findall(text):
        if "class Model" in block:
            return block
    return text if "class Model" in text else None


def task_from_input(state: StitchState) -> tuple[Task | None, AgentFailure | None]:
    """Load the task from ``problem_path`` or the last human message carrying a problem."""
    from stitch_graph.task import TaskLoadError, load_task

    try:
        if state.get("problem_path"):
            return load_task(state["problem_path"]), None
        for message in reversed(state.get("messages", [])):
            if getattr(message, "type", "") != "human":
                continue
            source = problem_source_from_text(str(message.content))
            if source is not None:
                return load_task(source), None
    except TaskLoadError as exc:
        return None, AgentFailure(agent="planner", reason=str(exc))
    reason = (
        "no task: pass `task`, `problem_path`, or a message containing a KernelBench problem "
        "(a ```python block defining Model, get_inputs and get_init_inputs)"
    )
    return None, AgentFailure(agent="planner", reason=reason)
