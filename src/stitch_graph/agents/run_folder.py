"""A run folder: the program, a KernelBench ``ModelNew`` file and the reports of a finished run.

The command line and the Python API write the same folder through ``write_run``, so a run
started from either leaves the same files: ``program.cu``, ``host.py`` (``host.cpp`` for the
shared-library form), ``model_new.py``, ``report.md`` and ``report.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stitch_graph.artifacts import Candidate, Task

__all__ = ["program_of", "render_markdown", "write_run"]


def _fmt(value: float | None, suffix: str = "") -> str:
    return "—" if value is None else f"{value:.3f}{suffix}"


def render_markdown(state: dict[str, Any]) -> str:
    """The report of a finished run as Markdown; parts the state lacks are left out."""
    report = state["report"]
    lines = [f"# {report.task}: {report.outcome}", "", report.summary, ""]
    plan = state.get("plan")
    if plan is not None:
        lines += [f"## Plan (revision {plan.revision}, by {plan.author})", "", plan.summary, ""]
        lines += ["| item | kernel | kind | ops | status | note |", "|---|---|---|---|---|---|"]
        for i in plan.items:
            lines.append(
                f"| {i.id} | {i.kernel} | {i.kind} | {', '.join(i.ops)} | {i.status} | {i.note} |"
            )
        if plan.unsupported_ops:
            lines += [
                "",
                "Not in the generator's op table: "
                + "; ".join(op.removeprefix("unsupported: ") for op in plan.unsupported_ops),
            ]
        lines.append("")
    left = report.details.get("ops_left_to_pytorch") or {}
    if left:
        lines += [
            "## Left to PyTorch (partial program)",
            "",
            "| op | call sites in host.py |",
            "|---|---|",
            *(f"| {op} | {count or 'not found'} |" for op, count in left.items()),
            "",
        ]
    budget = report.details.get("round_budget")
    lines.append(f"Rounds: {report.rounds}" + (f" of a budget of {budget}" if budget else "") + ".")
    spent = report.details.get("seconds_by_step") or {}
    if spent:
        lines.append(
            "Verifier time by step: "
            + ", ".join(f"{step} {seconds:.1f} s" for step, seconds in spent.items())
            + "."
        )
    lines.append("")
    history = state.get("history", [])
    if history:
        lines += [
            "## Rounds",
            "",
            "| round | item | author | compiled | test | vs eager | "
            "vs torch.compile | verdict | seconds |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in history:
            lines.append(
                f"| {r.round} | {r.item_id} | {r.author} | {r.compiled} | {r.test} | "
                f"{_fmt(r.speedup_vs_eager, 'x')} | {_fmt(r.speedup_vs_compile, 'x')} | "
                f"{r.feedback}: {r.summary} | {r.seconds:.1f} |"
            )
        lines.append("")
    best = report.best
    if best is not None and best.timing is not None:
        t = best.timing
        lines += [
            "## Timing of the best program",
            "",
            f"Device: {t.device}; median of {t.runs} runs, same process and inputs for all three.",
            "",
            "| program | ms |",
            "|---|---|",
            f"| candidate | {_fmt(t.candidate_ms)} |",
            f"| PyTorch eager | {_fmt(t.eager_ms)} |",
            f"| torch.compile | {_fmt(t.compile_ms)} |",
            "",
        ]
    tuning = state.get("tuning")
    if tuning is not None:
        lines += [
            "## Autotuning",
            "",
            f"{tuning.seconds:.1f} s on {tuning.device or 'no GPU'}"
            + (f"; {tuning.note}" if tuning.note else "")
            + (f"; {tuning.speedup:.2f}x in the tuner's timing" if tuning.speedup else ""),
            "",
        ]
        if tuning.choices:
            lines += [
                "| kernel | kind | chosen | programs timed | ms before | ms after |",
                "|---|---|---|---|---|---|",
            ]
            for c in tuning.choices:
                origin = "cache" if c.cached else str(c.tried)
                lines.append(
                    f"| {c.item} | {c.kind} | {c.setting or 'defaults'} | {origin} | "
                    f"{_fmt(c.base_ms)} | {_fmt(c.best_ms)} |"
                )
            lines.append("")
    failures = report.details.get("failures") or []
    if failures:
        lines += ["## Agent failures", ""] + [f"- {f['agent']}: {f['reason']}" for f in failures]
    return "\n".join(lines) + "\n"


def program_of(state: dict[str, Any]) -> Candidate | None:
    """The program a run returns: its best correct one, else the last one that compiled."""
    report = state.get("report")
    if report is not None and report.best is not None:
        return report.best.candidate
    if state.get("last_compiled") is not None:
        return state["last_compiled"]
    program = (state.get("result") or {}).get("program")
    return Candidate.model_validate(program) if program else None


def write_run(state: Any, out_dir: str | Path, *, task: Task | None = None) -> dict[str, Path]:
    """Write a finished run's program and reports into ``out_dir`` (created if missing).

    Args:
        state: The run's state: ``graph.get_state(config)`` (a snapshot) or its ``values``, or
            what ``graph.invoke`` returned (then the plan and round tables are left out of
            ``report.md``, since the graph's output holds only the report and the result).
        out_dir: The run folder.
        task: The problem, for ``model_new.py`` when ``state`` does not hold it (the output
            of ``invoke`` does not).

    Returns:
        Each written file's name and path; empty when the state holds no report yet.

    Example:
        >>> files = write_run(graph.get_state(config), "runs/demo")  # doctest: +SKIP
        >>> files["program.cu"].read_text()  # doctest: +SKIP
    """
    values = dict(state if isinstance(state, dict) else state.values)
    report = values.get("report")
    if report is None:
        return {}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    texts = {"report.json": report.model_dump_json(indent=1), "report.md": render_markdown(values)}
    program = program_of(values)
    task = values.get("task") or task
    if program is not None:
        texts["program.cu"] = program.kernel_source
        texts["host.py"] = program.host_source
        if program.host_cpp:
            texts["host.cpp"] = program.host_cpp
        if task is None:
            texts["model_new.error.txt"] = (
                "no model_new.py: the state holds no task; pass graph.get_state(config) or "
                "write_run(..., task=task)\n"
            )
        else:
            try:
                from stitch_graph.execution import export_kernelbench

                texts["model_new.py"] = export_kernelbench(program, task)
            except Exception as exc:  # export is a convenience; the program files are written
                texts["model_new.error.txt"] = f"export failed: {exc}\n"
    written = {}
    for name, text in texts.items():
        (out / name).write_text(text)
        written[name] = out / name
    return written
