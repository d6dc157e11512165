"""Turn rounds of a run into training samples for the two atomic skills.

StitchCUDA trains the Coder on two skills: writing a kernel program from the task and a plan item,
and improving a program from the Verifier's feedback. Every round of a run is a sample of one of
them, labelled with its reward. This module writes them as JSONL, one file per skill, so a trainer
can read them without importing this package. Samples the hack checks rejected are kept (reward 0,
with a ``hack`` field) as negatives unless asked otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from stitch_graph.artifacts import (
    Candidate,
    Feedback,
    HackReport,
    Task,
    TestResult,
    TimingResult,
    TodoItem,
)
from stitch_graph.reward.reward import RewardBreakdown

__all__ = [
    "IMPROVE_FILE",
    "WRITE_FILE",
    "ExportReport",
    "RoundSample",
    "Skill",
    "export_training_data",
    "sample_record",
    "write_task_samples",
]

WRITE_FILE = "write_from_task.jsonl"
IMPROVE_FILE = "improve_from_feedback.jsonl"

Skill = Literal["write_from_task", "improve_from_feedback"]


class RoundSample(BaseModel):
    """Everything about one round that a training sample needs."""

    task_name: str = ""
    task_source: str
    plan_item: TodoItem | None = None
    previous_candidate: Candidate | None = None
    feedback: Feedback | None = None
    candidate: Candidate
    test: TestResult
    timing: TimingResult | None = None
    hack_report: HackReport = Field(default_factory=HackReport)
    reward: RewardBreakdown

    @property
    def skill(self) -> Skill:
        """``improve_from_feedback`` when there is a previous candidate and feedback."""
        if self.previous_candidate is not None and self.feedback is not None:
            return "improve_from_feedback"
        return "write_from_task"


class ExportReport(BaseModel):
    """What an export wrote."""

    out_dir: str
    files: dict[str, str] = Field(default_factory=dict, description="skill -> file path")
    counts: dict[str, int] = Field(default_factory=dict, description="skill -> samples written")
    hacks_written: int = 0
    hacks_skipped: int = 0

    @property
    def total(self) -> int:
        """Samples written in all files."""
        return sum(self.counts.values())


def _program(candidate: Candidate) -> dict[str, Any]:
    return candidate.model_dump(
        include={
            "kernel_source",
            "host_source",
            "form",
            "host_cpp",
            "link_libraries",
            "declared_torch_ops",
        }
    )


def sample_record(sample: RoundSample) -> dict[str, Any]:
    """The JSON object written for one sample.

    Args:
        sample: The round.

    Returns:
        A dict with ``skill``, ``task``, ``prompt``, ``response``, ``reward`` (the final value;
        0 for a hack), ``reward_breakdown``, ``test``, ``speedup`` and ``hack`` (None, or the
        rules and findings that rejected it).
    """
    prompt: dict[str, Any] = {
        "task_source": sample.task_source,
        "plan_item": sample.plan_item.model_dump() if sample.plan_item else None,
    }
    if sample.skill == "improve_from_feedback":
        assert sample.previous_candidate is not None and sample.feedback is not None
        prompt["previous_candidate"] = _program(sample.previous_candidate)
        prompt["feedback"] = sample.feedback.model_dump()
    hacked = sample.hack_report.rejected or sample.reward.hacked
    hack = None
    if hacked:
        hack = {
            "rules": sample.hack_report.rules,
            "findings": [f.model_dump() for f in sample.hack_report.findings],
        }
    return {
        "skill": sample.skill,
        "task": sample.task_name,
        "prompt": prompt,
        "response": _program(sample.candidate),
        "reward": 0.0 if hacked else sample.reward.value,
        "reward_breakdown": sample.reward.model_dump(),
        "test": sample.test.status,
        "speedup": sample.reward.speedup,
        "declared_uses": sample.hack_report.declared_uses,
        "hack": hack,
    }


def export_training_data(
    records: Iterable[RoundSample],
    out_dir: str | Path,
    *,
    include_hacks: bool = True,
    append: bool = False,
) -> ExportReport:
    """Write samples to ``write_from_task.jsonl`` and ``improve_from_feedback.jsonl``.

    Both files are always created (possibly empty) so a trainer can rely on them.

    Args:
        records: The rounds to export.
        out_dir: Folder for the two files; created if missing.
        include_hacks: Keep rejected samples (reward 0, ``hack`` set) as negatives.
        append: Add to existing files instead of replacing them.

    Returns:
        An :class:`ExportReport` with paths and counts.
    """
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    paths: dict[Skill, Path] = {
        "write_from_task": folder / WRITE_FILE,
        "improve_from_feedback": folder / IMPROVE_FILE,
    }
    report = ExportReport(
        out_dir=str(folder),
        files={skill: str(path) for skill, path in paths.items()},
        counts=dict.fromkeys(paths, 0),
    )
    mode = "a" if append else "w"
    handles = {skill: path.open(mode, encoding="utf-8") for skill, path in paths.items()}
    try:
        for sample in records:
            record = sample_record(sample)
            if record["hack"] is not None:
                if not include_hacks:
                    report.hacks_skipped += 1
                    continue
                report.hacks_written += 1
            handles[sample.skill].write(json.dumps(record, ensure_ascii=False) + "\n")
            report.counts[sample.skill] += 1
    finally:
        for handle in handles.values():
            handle.close()
    return report


def write_task_samples(
    history: Iterable[RoundSample],
    task: Task,
    path: str | Path,
    *,
    include_hacks: bool = True,
) -> ExportReport:
    """Append the rounds of one task's run to the training files in ``path``.

    Samples get the task's name and source, so a run's history can be recorded without them.

    Args:
        history: The run's rounds, in order.
        task: The task they belong to.
        path: Folder holding the two JSONL files.
        include_hacks: Keep rejected samples as negatives.

    Returns:
        An :class:`ExportReport` counting what this call added.
    """
    samples = (
        s.model_copy(update={"task_name": task.name, "task_source": task.source}) for s in history
    )
    return export_training_data(samples, path, include_hacks=include_hacks, append=True)
