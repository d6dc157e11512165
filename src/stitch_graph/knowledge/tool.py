"""A plain search function for agents: the knowledge index as readable text.

Chat models read text, not pydantic objects, so this renders the ranked hits with their ids,
tags and a snippet. Colleagues wrap it as a LangChain tool; keeping it a plain function keeps
this package free of agent machinery.
"""

from __future__ import annotations

from stitch_graph.knowledge.index import default_index

__all__ = ["search_cuda_knowledge"]


def search_cuda_knowledge(query: str, k: int = 3) -> str:
    """Search the CUDA optimisation knowledge base and return the best entries as text.

    Use this when a profile or a build shows a problem and you need a concrete fix: pass the
    finding in plain words or paste the message, for example "DRAM throughput 92% of peak,
    compute 8%, elementwise kernel", "ptxas: 256 bytes spill stores, 255 registers",
    'error: identifier "__shfl_down" is undefined' or "achieved occupancy 12% with 1024 threads
    per block". Exact identifiers (``__syncthreads``, ``cp.async``, ``sm_90a``) are matched
    literally, so include them when you have them.

    Args:
        query: The finding, error message or question.
        k: How many entries to return (1-10).

    Returns:
        A numbered list; each item gives the entry id (cite it as ``knowledge:<id>``), its title,
        the suggested action, the bottleneck tags, and a short summary. "No matching entries."
        when nothing matched.
    """
    k = max(1, min(int(k), 10))
    hits = default_index().search(query, k=k)
    if not hits:
        return "No matching entries."
    lines = [f"Knowledge entries for: {query}"]
    for rank, hit in enumerate(hits, start=1):
        tags = ", ".join(hit.bottlenecks) or "user document"
        lines.append(f"{rank}. [{hit.id}] {hit.title} (score {hit.score:.2f}; {tags})")
        if hit.action:
            lines.append(f"   Action: {hit.action}")
        if hit.snippet:
            lines.append(f"   {hit.snippet}")
        if hit.references:
            lines.append(f"   Sources: {'; '.join(hit.references[:2])}")
    return "\n".join(lines)
