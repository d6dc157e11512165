"""One captured program graph per task and process.

Capturing the reference (torch.fx) is cheap but not free, and the captured graph does not belong
in checkpoints; the rule-based agents share it through this cache, keyed by the task's hash.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from stitch_graph.artifacts import Task

if TYPE_CHECKING:
    from stitch_graph.codegen import ProgramIR

_BY_DIGEST: dict[tuple[str, bool], ProgramIR] = {}


def program_ir(task: Task, *, exact_order: bool = False) -> ProgramIR:
    """The captured program of ``task``, capturing it on first use; ``exact_order``: the one
    whose sums keep the reference's order (``Plan.exact_order``)."""
    key = (task.digest, exact_order)
    ir = _BY_DIGEST.get(key)
    if ir is None:
        ir = _capture()(task, exact_order=exact_order)
        _BY_DIGEST[key] = ir
    return ir


@functools.cache
def _capture():
    from stitch_graph.codegen import capture_program

    return capture_program
