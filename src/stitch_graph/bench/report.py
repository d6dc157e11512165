"""A sweep's reports: JSON, CSV, and one self-contained HTML page with plots and tables.

Every file is written to a temporary name and moved into place (``os.replace``), so a reader, or
a sweep killed while writing, never leaves half a report. The HTML page embeds its plots as
base64 PNG (matplotlib figures drawn with Agg: no display, no network), so it opens offline anywhere:
the speedup distribution, per-group bars against each baseline, the best speedup by round, and
where the time went.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from stitch_graph.bench.suite import BASELINES, FAST_P

__all__ = ["CSV_COLUMNS", "plots", "render_html", "write_atomic", "write_reports"]

CSV_COLUMNS = [
    "problem",
    "group",
    "mode",
    "outcome",
    "correct",
    "rounds",
    "seconds",
    "candidate_ms",
    *[f"{b}_ms" for b in BASELINES],
    *[f"vs_{b}" for b in BASELINES],
    "declared_torch_ops",
    "host",
    "device",
    "error",
]


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _csv_text(rows: list[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        cells = dict(row)
        cells["declared_torch_ops"] = ";".join(row.get("declared_torch_ops") or [])
        writer.writerow(cells)
    return buffer.getvalue()


def _png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def plots(rows: list[dict[str, Any]], summary: dict[str, Any]) -> dict[str, str]:
    """The report's figures as base64 PNG, by name; empty when matplotlib is missing.

    A figure with nothing to show (no timed row, no round) is left out.
    """
    try:  # Figure objects draw with Agg and touch no pyplot state (threads, notebooks)
        from matplotlib.figure import Figure
        from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter
    except ImportError:
        return {}

    def subplots(width: float, height: float) -> tuple[Any, Any]:
        figure = Figure(figsize=(width, height))
        return figure, figure.subplots()

    figures: dict[str, str] = {}
    timed = {
        b: [r[f"vs_{b}"] for r in rows if r.get("correct") and r.get(f"vs_{b}")] for b in BASELINES
    }
    if any(timed.values()):
        fig, ax = subplots(7, 3.6)
        everything = [v for values in timed.values() for v in values]
        low, high = math.log10(min(everything)), math.log10(max(everything))
        if high - low < 0.2:
            low, high = low - 0.1, high + 0.1
        bins = [10 ** (low + (high - low) * k / 24) for k in range(25)]  # shared, log-spaced
        for baseline, values in timed.items():
            if values:
                ax.hist(
                    values, bins=bins, histtype="step", linewidth=1.5, label=BASELINES[baseline]
                )
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks([2.0**k for k in range(-6, 8) if bins[0] <= 2.0**k <= bins[-1]] or [1.0])
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_xlabel("speedup (baseline time / candidate time, log scale)")
        ax.set_ylabel("problems")
        ax.legend(fontsize=8)
        ax.set_title("Speedup distribution (correct programs)")
        figures["distribution"] = _png(fig)
    groups = summary["groups"]
    if any(g["geomean"].get(b) for g in groups.values() for b in BASELINES):
        fig, ax = subplots(max(5, 1.6 * len(groups)), 3.6)
        width = 0.8 / len(BASELINES)
        for i, baseline in enumerate(BASELINES):
            heights = [groups[g]["geomean"].get(baseline) or 0 for g in groups]
            xs = [k + i * width for k in range(len(groups))]
            ax.bar(xs, heights, width=width, label=BASELINES[baseline])
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([k + 0.4 - width / 2 for k in range(len(groups))], list(groups))
        ax.set_ylabel("geometric-mean speedup")
        ax.legend(fontsize=8)
        ax.set_title("Per group against each baseline")
        figures["groups"] = _png(fig)
    curves = [r["best_per_round"] for r in rows if any(r.get("best_per_round") or [])]
    if curves:
        fig, ax = subplots(7, 3.6)
        for curve in curves:
            ys = [c or float("nan") for c in curve]
            ax.plot(range(1, len(curve) + 1), ys, marker=".", alpha=0.35)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("round")
        ax.set_ylabel("best speedup vs eager so far")
        ax.set_title("Best speedup by round (one line per problem)")
        figures["rounds"] = _png(fig)
    spent: dict[str, float] = {}
    for row in rows:
        steps = row.get("time_spent") or {}
        for step, seconds in steps.items():
            spent[step] = spent.get(step, 0.0) + seconds
        rest = (row.get("seconds") or 0.0) - sum(steps.values())
        if steps and rest > 0:  # the agents' own time: planning, writing code, waiting
            spent["agents and the rest"] = spent.get("agents and the rest", 0.0) + rest
        if row.get("baseline_seconds"):
            spent["baselines"] = spent.get("baselines", 0.0) + row["baseline_seconds"]
    if spent:
        fig, ax = subplots(7, 3.2)
        names = sorted(spent, key=spent.get, reverse=True)
        ax.barh(names, [spent[n] for n in names])
        ax.invert_yaxis()
        ax.set_xlabel("seconds, summed over problems")
        ax.set_title("Where the time went")
        figures["time"] = _png(fig)
    return figures


def _fmt(value: Any, spec: str = ".2f") -> str:
    if isinstance(value, bool) or value is None:
        return {True: "yes", False: "no", None: "-"}[value]
    if isinstance(value, float):
        return format(value, spec)
    return html.escape(str(value))


def _summary_table(summary: dict[str, Any]) -> str:
    head = ["group", "problems", "correct", "success"] + [
        f"gm vs {BASELINES[b]}" for b in BASELINES
    ]
    head += [f"fast_{p:g} vs eager" for p in FAST_P]
    lines = ["<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"]
    for name, s in [*summary["groups"].items(), ("ALL", summary["all"])]:
        cells = [name, s["problems"], s["correct"], s["success_rate"]]
        cells += [s["geomean"].get(b) for b in BASELINES]
        cells += [s["fast_p"]["eager"].get(f"{p:g}") for p in FAST_P]
        lines.append("<tr>" + "".join(f"<td>{_fmt(c)}</td>" for c in cells) + "</tr>")
    return "\n".join([*lines, "</table>"])


def _rows_table(rows: list[dict[str, Any]]) -> str:
    columns = ["problem", "outcome", "correct", "rounds", "seconds", "candidate_ms"]
    columns += [f"vs_{b}" for b in BASELINES]
    lines = ["<table><tr>" + "".join(f"<th>{c}</th>" for c in columns) + "</tr>"]
    for row in rows:
        lines.append(
            "<tr>" + "".join(f"<td>{_fmt(row.get(c), '.4g')}</td>" for c in columns) + "</tr>"
        )
    return "\n".join([*lines, "</table>"])


def render_html(
    rows: list[dict[str, Any]], summary: dict[str, Any], machine: dict[str, Any]
) -> str:
    """The HTML page: machine, notes, summary, plots and every row."""
    figures = plots(rows, summary)
    titles = {
        "distribution": "Speedup distribution",
        "groups": "Per group against each baseline",
        "rounds": "Best speedup by round",
        "time": "Where the time went",
    }
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>stitch-graph bench</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}</style></head><body>",
        "<h1>stitch-graph bench</h1>",
        f"<p>{html.escape(json.dumps(machine, default=str))}</p>",
    ]
    for note in summary.get("notes", []) + ([summary["note"]] if summary.get("note") else []):
        parts.append(f"<p><b>{html.escape(note)}</b></p>")
    parts += ["<h2>Summary</h2>", _summary_table(summary)]
    if not figures:
        parts.append(
            "<p>No plots: nothing was timed, or matplotlib is missing "
            "(pip install 'stitch-graph[bench]').</p>"
        )
    for name, data in figures.items():
        parts.append(
            f"<h2>{titles[name]}</h2><img alt='{name}' src='data:image/png;base64,{data}'>"
        )
    parts += ["<h2>Problems</h2>", _rows_table(rows), "</body></html>"]
    return "\n".join(parts)


def write_reports(
    folder: Path, rows: list[dict[str, Any]], summary: dict[str, Any], machine: dict[str, Any]
) -> dict[str, Path]:
    """Write ``bench.json``, ``bench.csv`` and ``report.html`` into ``folder``.

    Returns:
        The files by format.
    """
    folder = Path(folder)
    files = {
        "json": folder / "bench.json",
        "csv": folder / "bench.csv",
        "html": folder / "report.html",
    }
    data = {"machine": machine, "summary": summary, "rows": rows}
    write_atomic(files["json"], json.dumps(data, indent=1, default=str))
    write_atomic(files["csv"], _csv_text(rows))
    write_atomic(files["html"], render_html(rows, summary, machine))
    return files
