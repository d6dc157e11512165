"""Benchmark sweeps: problems of a suite, their rows on disk, baselines, summaries, reports.

``stitch-graph bench`` is built on this package; it holds no agent machinery (the command line
runs the graph and hands each finished problem's report here), so a script or a CI job can read a
sweep's rows, summarise them and write the reports without LangChain.
"""

from stitch_graph.bench.measure import (
    add_speedups,
    row_from_report,
    row_from_verdict,
    time_baselines,
)
from stitch_graph.bench.report import write_reports
from stitch_graph.bench.suite import (
    BASELINES,
    FAST_P,
    RowStore,
    find_problems,
    geomean,
    group_of,
    machine_info,
    speedup,
    summarize,
)

__all__ = [
    "BASELINES",
    "FAST_P",
    "RowStore",
    "add_speedups",
    "find_problems",
    "geomean",
    "group_of",
    "machine_info",
    "row_from_report",
    "row_from_verdict",
    "speedup",
    "summarize",
    "time_baselines",
    "write_reports",
]
