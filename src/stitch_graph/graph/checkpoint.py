"""Checkpointers that know the project's artefacts.

LangGraph's serializer restores pydantic objects only from modules it is told about; without the
allowlist a restore warns and later refuses. ``artifact_serializer`` names every artefact type.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from pydantic import BaseModel

from stitch_graph import artifacts


def artifact_types() -> list[type[BaseModel]]:
    """Every pydantic type that can appear in the graph state."""
    return [
        obj
        for obj in vars(artifacts).values()
        if isinstance(obj, type)
        and issubclass(obj, BaseModel)
        and obj.__module__ == artifacts.__name__
    ]


def artifact_serializer() -> JsonPlusSerializer:
    """A serializer whose msgpack allowlist holds the artefact types."""
    allow = [(t.__module__, t.__name__) for t in artifact_types()]
    return JsonPlusSerializer(allowed_msgpack_modules=allow)


def sqlite_checkpointer(path: str | Path):
    """A ``SqliteSaver`` on ``path`` (created if missing) with the artefact serializer."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    connection = sqlite3.connect(str(path), check_same_thread=False)
    return SqliteSaver(connection, serde=artifact_serializer())


def memory_checkpointer():
    """An in-memory saver with the artefact serializer (tests, notebooks)."""
    from langgraph.checkpoint.memory import InMemorySaver

    return InMemorySaver(serde=artifact_serializer())
