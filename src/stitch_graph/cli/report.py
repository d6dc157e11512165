"""A readable Markdown report of a run: outcome, plan, rounds and the measured numbers."""

from __future__ import annotations

from typing import Any


def _fmt(value: float | None, suffix: str = "") -> str:
    return "—" if value is None else f"{value:.3f}{suffix}"


def render_markdown(state: dict[str, Any]) -> str:
    """The report of a finished run as Markdown."""
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
                "Unsupported (left to PyTorch, declared): " + ", ".join(plan.unsupported_ops),
            ]
        lines.append("")
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
