"""Command bodies for ``stitch-graph knowledge add|search``.

The top-level CLI parses arguments and calls these; they print for people and return an exit
status, so they can be tested without a subprocess.
"""

from __future__ import annotations

from typing import get_args

from rich.console import Console
from rich.markup import escape

from stitch_graph.knowledge.documents import add_documents
from stitch_graph.knowledge.index import SearchMode, default_index

__all__ = ["cmd_add", "cmd_search"]


def cmd_add(paths: list[str]) -> int:
    """Add documents to the knowledge store and report what happened.

    Args:
        paths: Files or folders (Markdown, text, HTML, PDF with pypdf).

    Returns:
        0 when at least one chunk was added or everything was a duplicate; 1 when no file could
        be read.
    """
    console = Console()
    if not paths:
        console.print("no paths given")
        return 2
    report = add_documents(paths)
    console.print(escape(report.summary()))
    for path, why in report.skipped.items():
        console.print(f"  skipped {escape(path)}: {escape(why)}")
    console.print(f"store: {escape(report.store)}", soft_wrap=True)  # a path to copy whole
    nothing_read = not report.files and not report.duplicate_chunks
    return 1 if nothing_read and report.skipped else 0


def cmd_search(query: str, k: int = 3, mode: str = "hybrid") -> int:
    """Search the knowledge index and print the ranked hits.

    Args:
        query: A finding, error message or question.
        k: How many hits.
        mode: ``hybrid``, ``dense`` or ``keyword``.

    Returns:
        0 with hits, 1 with none, 2 for a bad mode.
    """
    console = Console()
    modes = get_args(SearchMode)
    if mode not in modes:
        console.print(f"unknown mode {escape(mode)!r}; use one of {', '.join(modes)}")
        return 2
    index = default_index()
    hits = index.search(query, k=k, mode=mode)  # type: ignore[arg-type]
    if not hits:
        console.print("no matching entries")
        return 1
    for rank, hit in enumerate(hits, start=1):
        tags = ", ".join(hit.bottlenecks) or "user document"
        console.print(
            f"[bold]{rank}. {escape(hit.title)}[/bold]  [dim]{escape(hit.id)} · "
            f"{hit.score:.3f} · {escape(tags)}[/dim]"
        )
        if hit.action:
            console.print(f"   action: {escape(hit.action)}")
        if hit.snippet:
            console.print(f"   {escape(hit.snippet)}")
        console.print(f"   [dim]{escape(hit.source)}[/dim]")
    console.print(f"[dim]embedder: {escape(index.embedder_name)}[/dim]")
    return 0
