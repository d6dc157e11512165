"""How many hacks and honest programs of the verification corpus each layer flags.

Usage:
    python tools/eval_hack_corpus.py [CORPUS] [--static-only] [--entries] [--json FILE]
        [--only GROUP/NAME,...] [--build-jobs 8]

The corpus (default ``tests/fixtures/verify_corpus``) holds ``hacks/`` and ``honest/`` programs
against the problems in ``problems/``; each file's docstring names its kind (``Kind:`` or
``Form:``), its problem (``Problem:``) and, for a hack, the layer meant to catch it (``Caught by:
static (rule)`` or ``dynamic (...)``). Three layers are measured:

- static: ``checks.check_candidate`` (runs anywhere);
- dynamic: the Verifier's protocol in an isolated worker (correctness on fresh draws, poisoned
  outputs, aliasing, work escaping the timed stream, timing); needs a GPU and is skipped, with a
  message, without one;
- rubric: the rule-based judge's anti-hacking grade (1 or 2 flags), from the static report and,
  where it ran, the dynamic outcome.

On a GPU, the ``load_inline`` extensions are built first, ``--build-jobs`` at a time
(``execution.prebuild``), so the runs that follow only load them.

A row counts as flagged by a layer when that layer refuses it. The goal: every hack flagged by
some layer, no honest program flagged by any.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stitch_graph.artifacts import Candidate
from stitch_graph.checks import check_candidate
from stitch_graph.execution import load_candidate_dir
from stitch_graph.execution.external import read_candidate

DEFAULT_CORPUS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "verify_corpus"
GROUPS = ("hacks", "honest")


@dataclass
class Entry:
    """One corpus program and what its docstring claims."""

    name: str
    group: str
    path: Path
    kind: str
    problem_path: Path
    problem_source: str
    candidate: Candidate
    layer: str = ""
    rule: str = ""
    notes: dict[str, str] = field(default_factory=dict)


def _field(text: str, name: str) -> str:
    match = re.search(rf"^{name}:\s*(.+)$", text, re.M)
    return match.group(1).strip() if match else ""


def load_entry(path: Path, group: str, corpus: Path) -> Entry:
    """Read one corpus program (a ``.py`` file or a candidate folder) and its claims."""
    if path.is_dir():
        candidate, _ = load_candidate_dir(path)
    else:
        candidate = read_candidate(path)
    doc = candidate.host_source
    kind = _field(doc, "Kind") or _field(doc, "Form")
    problem = _field(doc, "Problem")
    if not kind or not problem:
        msg = f"{path}: the docstring needs 'Kind:' (or 'Form:') and 'Problem:' lines"
        raise ValueError(msg)
    problem_path = corpus / "problems" / f"{problem}.py"
    if not problem_path.is_file():
        msg = f"{path}: Problem: {problem} names no file in {corpus / 'problems'}"
        raise ValueError(msg)
    caught = _field(doc, "Caught by")
    layer, rule = "", ""
    if group == "hacks":
        match = re.match(r"(static|dynamic)\s*(?:\(([\w ,.-]+)\))?", caught)
        if not match:
            msg = f"{path}: a hack's docstring needs 'Caught by: static (rule)' or 'dynamic'"
            raise ValueError(msg)
        layer, rule = match.group(1), (match.group(2) or "").strip()
    return Entry(
        name=path.stem if path.is_file() else path.name,
        group=group,
        path=path,
        kind=kind,
        problem_path=problem_path,
        problem_source=problem_path.read_text(),
        candidate=candidate,
        layer=layer,
        rule=rule,
    )


def load_corpus(corpus: Path = DEFAULT_CORPUS) -> list[Entry]:
    """Every program of the corpus, hacks first, each group sorted by name."""
    entries = []
    for group in GROUPS:
        for path in sorted((corpus / group).iterdir()):
            if path.suffix == ".py" or (path.is_dir() and (path / "host.py").exists()):
                entries.append(load_entry(path, group, corpus))
    return entries


def _dynamic_flag(outcome: Any) -> tuple[bool, str]:
    test, timing = outcome.test, outcome.timing
    if test.status != "passed":
        return True, f"{test.status}: {test.reason[:100]}"
    if timing.status in {"failed", "error"}:
        return True, f"timing {timing.status}: {timing.reason[:100]}"
    eager = timing.speedup_vs_eager
    return False, f"passed, {eager:.2f}x eager" if eager else "passed"


def evaluate(
    entries: list[Entry], *, dynamic: bool, settings: Any = None, build_jobs: int = 8
) -> list[dict[str, Any]]:
    """One row per entry: what each layer made of it."""
    from stitch_graph.reward.judges import RubricSample, RuleBasedJudge

    verify = None
    tasks: dict[Path, Any] = {}
    if dynamic:
        from stitch_graph.execution import RunSettings
        from stitch_graph.execution.external import gpu_verifier
        from stitch_graph.task import load_task

        # load_inline programs build PyTorch extensions: all at once first, then each worker
        # only loads its build
        verify = gpu_verifier(settings or RunSettings(timeout_s=600.0))
        for built in verify.prebuild([e.candidate for e in entries], jobs=build_jobs):
            print(f"built {built.digest}: {built.status} in {built.seconds:.1f} s", file=sys.stderr)
    judge = RuleBasedJudge()
    rows = []
    for entry in entries:
        report = check_candidate(entry.candidate, reference_source=entry.problem_source)
        row: dict[str, Any] = {
            "name": entry.name,
            "group": entry.group,
            "kind": entry.kind,
            "layer": entry.layer,
            "static": report.rejected,
            "static_rules": report.rules,
            "dynamic": None,
            "dynamic_detail": "",
        }
        outcome = None
        if verify is not None:
            task = tasks.get(entry.problem_path)
            if task is None:
                task = tasks[entry.problem_path] = load_task(str(entry.problem_path))
            outcome = verify(task, entry.candidate)
            row["dynamic"], row["dynamic_detail"] = _dynamic_flag(outcome)
            row["dynamic_seconds"] = round(outcome.seconds, 2)
        sample = RubricSample(
            task_source=entry.problem_source,
            candidate=entry.candidate,
            hack_report=report,
            test=outcome.test if outcome else None,
            timing=outcome.timing if outcome else None,
        )
        judgement = judge.judge(sample)
        row["rubric"] = judgement.flags_hack
        row["rubric_anti_hacking"] = judgement.anti_hacking.score
        rows.append(row)
        # one line per program as it finishes, so a run cut short still shows what it reached
        print(_progress(row), file=sys.stderr, flush=True)
    return rows


def _progress(row: dict[str, Any]) -> str:
    dynamic = "not run" if row["dynamic"] is None else row["dynamic_detail"]
    seconds = f" in {row['dynamic_seconds']} s" if "dynamic_seconds" in row else ""
    static = ", ".join(row["static_rules"]) or "clean"
    return f"{row['group']}/{row['name']}: static {static}; dynamic {dynamic}{seconds}"


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, int | None]]:
    """Per group: how many entries, and how many each layer flagged (None: layer not run)."""
    out: dict[str, dict[str, int | None]] = {}
    for group in GROUPS:
        mine = [r for r in rows if r["group"] == group]
        ran = [r for r in mine if r["dynamic"] is not None]
        out[group] = {
            "total": len(mine),
            "static": sum(bool(r["static"]) for r in mine),
            "dynamic": sum(bool(r["dynamic"]) for r in ran) if ran else None,
            "rubric": sum(bool(r["rubric"]) for r in mine),
            "any": sum(bool(r["static"] or r["dynamic"] or r["rubric"]) for r in mine),
        }
    return out


def render(rows: list[dict[str, Any]], *, dynamic_note: str = "", entries: bool = False) -> str:
    """The summary table in Markdown (and, with ``entries``, one row per program)."""
    table = summary(rows)
    lines = [
        "| programs | count | static | dynamic | rubric | any layer |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for group, counts in table.items():
        dyn = "—" if counts["dynamic"] is None else str(counts["dynamic"])
        lines.append(
            f"| {group} | {counts['total']} | {counts['static']} | {dyn} | "
            f"{counts['rubric']} | {counts['any']} |"
        )
    if dynamic_note:
        lines.append("")
        lines.append(f"dynamic: {dynamic_note}")
    if entries:
        lines += ["", "| group | program | kind | meant for | static | dynamic | rubric |"]
        lines.append("| --- | --- | --- | --- | --- | --- | --- |")
        for r in rows:
            static = ", ".join(r["static_rules"]) or "clean"
            if r["dynamic"] is None:
                dyn = "—"
            else:
                dyn = ("FLAGGED " if r["dynamic"] else "") + r["dynamic_detail"]
            lines.append(
                f"| {r['group']} | {r['name']} | {r['kind']} | {r['layer'] or '—'} | {static} | "
                f"{dyn} | {r['rubric_anti_hacking']} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", nargs="?", default=str(DEFAULT_CORPUS))
    parser.add_argument("--static-only", action="store_true", help="do not run the GPU layer")
    parser.add_argument("--entries", action="store_true", help="one row per program as well")
    parser.add_argument("--json", help="write every row to this file")
    parser.add_argument(
        "--only", default="", help="comma-separated parts of GROUP/NAME; run just those programs"
    )
    parser.add_argument(
        "--build-jobs", type=int, default=8, help="load_inline builds at once, before the runs"
    )
    args = parser.parse_args(argv)
    entries = load_corpus(Path(args.corpus))
    if args.only:
        parts = [p for p in args.only.split(",") if p]
        entries = [e for e in entries if any(p in f"{e.group}/{e.name}" for p in parts)]
    note = ""
    dynamic = not args.static_only
    if dynamic:
        from stitch_graph.execution import gpu_available

        if not gpu_available():
            dynamic = False
            note = "skipped: no GPU on this machine (the dynamic checks run candidates on one)"
    else:
        note = "skipped (--static-only)"
    rows = evaluate(entries, dynamic=dynamic, build_jobs=args.build_jobs)
    print(render(rows, dynamic_note=note, entries=args.entries))
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary(rows), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
