"""Progress events: small dicts on LangGraph's ``custom`` stream, one shape for every agent.

``stream(..., stream_mode=["updates", "custom"])`` yields them; the CLI draws them as a progress
display and writes them to the run log.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def emit(writer: Callable[[Any], None] | None, agent: str, event: str, **data: Any) -> None:
    """Send one progress event (a no-op when the graph is not being streamed)."""
    if writer is None:
        return
    writer({"agent": agent, "event": event, "time": time.time(), **data})
