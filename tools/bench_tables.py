"""Markdown tables of finished ``stitch-graph bench`` sweeps, for the docs.

    python tools/bench_tables.py OUT [OUT ...]          # one table per sweep
    python tools/bench_tables.py --compare LOCAL RAY   # the same sweep on two executors

A sweep's table has one line per group and one for all problems: problems, correct, success
rate, fast_p against eager and torch.compile, and geometric means against the four baselines.
``--compare`` prints each sweep's wall time (first start to last finish), the problems whose
outcome differs, and the geometric mean of the second sweep's candidate times over the first's
(1.00: the second executor cost nothing measurable).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from stitch_graph.bench import BASELINES, FAST_P, geomean


def _cell(value: Any, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec) if isinstance(value, float) else str(value)


def table(data: dict[str, Any]) -> str:
    """The Markdown table of one ``bench.json``."""
    summary = data["summary"]
    head = ["group", "problems", "correct", "success"]
    head += [f"fast_{p:g} eager" for p in FAST_P] + [
        f"fast_1 {b}" for b in BASELINES if b != "eager"
    ]
    head += [f"gm {b}" for b in BASELINES]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name, s in [*summary["groups"].items(), ("all", summary["all"])]:
        cells = [name, s["problems"], s["correct"], _cell(s["success_rate"])]
        cells += [_cell(s["fast_p"]["eager"][f"{p:g}"]) for p in FAST_P]
        cells += [_cell(s["fast_p"][b]["1"]) for b in BASELINES if b != "eager"]
        cells += [_cell(s["geomean"][b]) for b in BASELINES]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    notes = [*summary.get("notes", []), summary.get("note") or ""]
    machine = data.get("machine", {})
    header = (
        f"{machine.get('gpu') or 'no GPU'}, torch {machine.get('torch')}, {machine.get('host')}"
    )
    return "\n".join([header, "", *lines, *[f"\n{n}" for n in notes if n]])


def wall_seconds(rows: list[dict[str, Any]]) -> float | None:
    """First start to last finish of the rows (None without timestamps)."""
    spans = [
        (r["finished"] - r.get("seconds", 0), r["finished"]) for r in rows if r.get("finished")
    ]
    return max(e for _, e in spans) - min(s for s, _ in spans) if spans else None


def compare(first: dict[str, Any], second: dict[str, Any]) -> str:
    """Wall times, differing outcomes and the candidate-time ratio of two sweeps."""
    a = {r["problem"]: r for r in first["rows"]}
    b = {r["problem"]: r for r in second["rows"]}
    common = sorted(a.keys() & b.keys())
    differ = [p for p in common if a[p].get("outcome") != b[p].get("outcome")]
    ratios = [
        b[p]["candidate_ms"] / a[p]["candidate_ms"]
        for p in common
        if a[p].get("candidate_ms") and b[p].get("candidate_ms")
    ]
    return "\n".join(
        [
            f"problems in both: {len(common)}; outcome differs: {len(differ)} {differ[:10]}",
            f"wall time: {_cell(wall_seconds(first['rows']), '.0f')} s vs "
            f"{_cell(wall_seconds(second['rows']), '.0f')} s",
            f"candidate time, second over first (geometric mean of {len(ratios)}): "
            f"{_cell(geomean(ratios), '.3f')}",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    """Print the tables (or the comparison)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outs", nargs="*", type=Path, help="bench output folders")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("FIRST", "SECOND"))
    args = parser.parse_args(argv)

    def load(folder: Path) -> dict[str, Any]:
        path = folder / "bench.json"
        if not path.exists():
            raise SystemExit(f"{path} does not exist: give the --out folder of a bench sweep")
        return json.loads(path.read_text())

    if args.compare:
        print(compare(*map(load, args.compare)))
    for folder in args.outs:
        print(f"### {folder.name}\n\n{table(load(folder))}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
