"""Measure the knowledge index on the labelled queries: recall@k, MRR and latency per mode.

Usage::

    python tools/eval_knowledge.py [--queries tools/knowledge_eval/queries.jsonl] [--k 3]
                                   [--embedder auto|minilm|hashing] [--misses]

The labelled queries live next to this script (``tools/knowledge_eval/``), not in the package:
they measure the index, the library does not need them.

Latency is measured per query after the index is loaded (model and store in memory), so it is
what an agent pays per lookup. The table also names the embedder, corpus size and machine, so
numbers from different machines are not confused.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from stitch_graph.knowledge.embeddings import get_embedder
from stitch_graph.knowledge.index import KnowledgeIndex

__all__ = ["evaluate", "load_queries", "main"]

MODES = ("hybrid", "dense", "keyword")
QUERIES_DIR = Path(__file__).resolve().parent / "knowledge_eval"


def load_queries(path: Path) -> list[dict]:
    """Read the labelled queries: one JSON object a line with ``query`` and ``expected``."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows


def evaluate(index: KnowledgeIndex, queries: list[dict], mode: str, k: int) -> dict:
    """Recall@k (any expected id in the top k), MRR over the full ranking, latency percentiles."""
    hits_at_k, rr, times, misses = 0, 0.0, [], []
    for row in queries:
        expected = set(row["expected"])
        start = time.perf_counter()
        ranked = index.search(row["query"], k=len(index.entries), mode=mode)
        times.append((time.perf_counter() - start) * 1000.0)
        ids = [h.id for h in ranked]
        if expected & set(ids[:k]):
            hits_at_k += 1
        else:
            misses.append((row["query"], sorted(expected), ids[:k]))
        rank = next((i + 1 for i, x in enumerate(ids) if x in expected), None)
        rr += 1.0 / rank if rank else 0.0
    times.sort()
    p95_index = min(len(times) - 1, max(0, round(0.95 * len(times)) - 1))
    return {
        "mode": mode,
        "recall": hits_at_k / len(queries),
        "mrr": rr / len(queries),
        "p50": statistics.median(times),
        "p95": times[p95_index],
        "misses": misses,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the evaluation and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=Path, default=QUERIES_DIR / "queries.jsonl")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--embedder", choices=("auto", "minilm", "hashing"), default="auto")
    parser.add_argument("--misses", action="store_true", help="list queries missed at k")
    args = parser.parse_args(argv)

    queries = load_queries(args.queries)
    start = time.perf_counter()
    index = KnowledgeIndex(embedder=get_embedder(args.embedder), include_user_documents=False)
    index.load()
    index.search("warm-up query: DRAM throughput", k=1)  # first call initialises the model
    load_s = time.perf_counter() - start

    results = [evaluate(index, queries, mode, args.k) for mode in MODES]
    print(
        f"embedder: {index.embedder_name} | corpus: {len(index.entries)} entries | "
        f"queries: {len(queries)} | load: {load_s:.1f} s "
        f"({'cache' if index.loaded_from_cache else 'built'})"
    )
    print(
        f"machine: {platform.platform()} | {platform.processor() or platform.machine()} | "
        f"CPUs: {os.cpu_count()} | Python {platform.python_version()}"
    )
    print()
    print(f"| mode    | recall@{args.k} | MRR   | p50 ms | p95 ms |")
    print("|---------|----------|-------|--------|--------|")
    for r in results:
        print(
            f"| {r['mode']:<7} | {r['recall']:8.3f} | {r['mrr']:.3f} | {r['p50']:6.1f} | "
            f"{r['p95']:6.1f} |"
        )
    if args.misses:
        for r in results:
            for query, expected, got in r["misses"]:
                print(f"[{r['mode']}] MISS {query!r}\n    expected {expected}\n    got      {got}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
