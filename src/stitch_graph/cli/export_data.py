"""``stitch-graph export-data RUN... --out PATH``: finished runs as one training dataset.

Each run folder's checkpoints are walked for its rounds (see ``reward.from_run``); the rounds
become rows of two splits, ``write_from_task`` and ``improve_from_feedback``, written as Parquet
and JSONL with a dataset card that ``datasets.load_dataset(PATH)`` reads.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "cmd_export_data", "run_samples"]

RUNS_DIR = Path("runs")


class RunFolderError(ValueError):
    """A path given as a run is not a run folder; the message says what to pass."""


def _run_folder(run: str) -> Path:
    folder = Path(run) if Path(run).is_dir() else RUNS_DIR / run
    if not (folder / "checkpoints.sqlite").exists():
        msg = (
            f"{folder}: no checkpoints.sqlite; pass a run folder written by "
            "`stitch-graph optimize` (or a run id under runs/)"
        )
        raise RunFolderError(msg)
    return folder


def run_samples(runs: list[str]) -> list[Any]:
    """The rounds of every run, oldest first, as ``RoundSample``s.

    Raises:
        RunFolderError: A path is not a run folder.
    """
    from stitch_graph.graph import create_stitch_graph
    from stitch_graph.graph.checkpoint import sqlite_checkpointer
    from stitch_graph.reward.from_run import samples_from_run

    samples: list[Any] = []
    for run in runs:
        folder = _run_folder(run)
        graph = create_stitch_graph(checkpointer=sqlite_checkpointer(folder / "checkpoints.sqlite"))
        samples += samples_from_run(graph, {"configurable": {"thread_id": folder.name}})
    return samples


def cmd_export_data(args: argparse.Namespace) -> int:
    """Write the rounds of finished runs as one dataset (two splits, Parquet and JSONL, a
    dataset card) that the datasets library loads."""
    from stitch_graph.reward.dataset import write_dataset

    try:
        samples = run_samples(args.runs)
    except RunFolderError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        report = write_dataset(samples, args.out, include_hacks=not args.no_hacks)
    except (ImportError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 2
    for split, count in report.counts.items():
        print(f"{split}: {count} rows -> {', '.join(report.files[split])}")
    if report.hacks_skipped:
        print(f"left out {report.hacks_skipped} samples rejected as hacks")
    print(f"dataset card: {report.card}")
    return 0


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``export-data`` on the ``stitch-graph`` sub-command parsers."""
    parser = sub.add_parser(
        "export-data",
        help="finished runs as one training dataset (two splits, Parquet + JSONL, a card)",
        description=cmd_export_data.__doc__,
    )
    parser.add_argument("runs", nargs="+", help="run folders or run ids under runs/")
    parser.add_argument("--out", required=True, help="dataset folder")
    parser.add_argument(
        "--no-hacks", action="store_true", help="leave out samples rejected as hacks"
    )
    parser.set_defaults(func=cmd_export_data)
    return parser
