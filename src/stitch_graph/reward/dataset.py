"""Training samples as one dataset: chat prompts, two splits, Parquet and JSONL, a dataset card.

The two atomic skills become two splits of one dataset: ``write_from_task`` (task -> code) and
``improve_from_feedback`` (code + feedback -> better code). Each row holds the prompt as chat
messages and the program as an assistant message (the ``prompt``/``completion`` columns that
TRL's trainers read), the reward and its terms, and the problem's text in ``problem`` (the
column :class:`~stitch_graph.reward.grpo.KernelReward` reads). Every split is written as Parquet
and as JSONL; ``README.md`` carries the YAML ``configs:`` block through which
``datasets.load_dataset(PATH)`` finds the Parquet splits; the card shows how to load the JSONL
copies with the ``json`` loader.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from stitch_graph.artifacts import Candidate
from stitch_graph.reward.criteria import criteria_text
from stitch_graph.reward.export import RoundSample

__all__ = [
    "SPLITS",
    "DatasetReport",
    "chat_prompt",
    "completion_messages",
    "dataset_row",
    "write_dataset",
]

SPLITS: tuple[str, ...] = ("write_from_task", "improve_from_feedback")

_SYSTEM = (
    "You write CUDA for PyTorch programs. Answer with a KernelBench ModelNew: keep the "
    "reference's constructor arguments, parameter names and outputs; do the work in your own "
    "CUDA kernels (or cuBLAS/cuDNN) in FP32 on PyTorch's current stream. Never let PyTorch or "
    "another code generator compute the result, cache or fake outputs, lower precision or touch "
    "the timer."
)
_FORMAT = (
    'Answer with the program in fenced code blocks: a ```cuda block with the extern "C" '
    "__global__ kernels and a ```python block defining ModelNew that launches them through "
    "KERNELS, or one ```python block that builds its own kernels (CuPy RawKernel, load_inline)."
)


def _program_blocks(candidate: Candidate) -> str:
    parts = []
    if candidate.kernel_source.strip():
        parts.append(f"```cuda\n{candidate.kernel_source.rstrip()}\n```")
    if candidate.host_cpp:
        parts.append(f"```cpp\n{candidate.host_cpp.rstrip()}\n```")
    parts.append(f"```python\n{candidate.host_source.rstrip()}\n```")
    return "\n\n".join(parts)


def chat_prompt(sample: RoundSample) -> list[dict[str, str]]:
    """The prompt of a sample as chat messages (system, then user)."""
    user = [
        f"Reference program (KernelBench format):\n```python\n{sample.task_source.rstrip()}\n```"
    ]
    if sample.plan_item is not None:
        item = sample.plan_item
        ops = ", ".join(item.ops) or "see the reference"
        user.append(f"Plan item {item.id}: kernel {item.kernel} ({item.kind}), ops: {ops}.")
    if sample.skill == "improve_from_feedback":
        assert sample.previous_candidate is not None and sample.feedback is not None
        user.append(f"Your previous program:\n{_program_blocks(sample.previous_candidate)}")
        items = "\n".join(
            f"- {i.action}" + (f": {i.detail}" if i.detail else "") for i in sample.feedback.items
        )
        summary = sample.feedback.summary or sample.feedback.category
        user.append(f"Verifier feedback ({summary}):\n{items or '- (no items)'}")
        user.append("Write the improved program.")
    else:
        user.append("Write the program.")
    user.append(_FORMAT)
    return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": "\n\n".join(user)}]


def completion_messages(candidate: Candidate) -> list[dict[str, str]]:
    """The program as the assistant's answer."""
    return [{"role": "assistant", "content": _program_blocks(candidate)}]


def dataset_row(sample: RoundSample) -> dict[str, Any]:
    """One row of the dataset; every split has the same columns and types."""
    hacked = sample.hack_report.rejected or sample.reward.hacked
    return {
        "prompt": chat_prompt(sample),
        "completion": completion_messages(sample.candidate),
        "skill": sample.skill,
        "task": sample.task_name,
        "problem": sample.task_source,
        "reward": 0.0 if hacked else float(sample.reward.value),
        "correct": bool(sample.reward.correct),
        "hacked": bool(hacked),
        "speedup": float(sample.reward.speedup),
        "rubric": float(sample.reward.rubric),
        "test_status": sample.test.status,
        "hack_rules": list(sample.hack_report.rules),
        "declared_uses": list(sample.hack_report.declared_uses),
        "form": sample.candidate.form,
        "reward_breakdown": json.dumps(sample.reward.model_dump()),
    }


class DatasetReport(BaseModel):
    """What :func:`write_dataset` wrote."""

    out_dir: str
    counts: dict[str, int] = Field(default_factory=dict, description="split -> rows")
    files: dict[str, list[str]] = Field(default_factory=dict, description="split -> files")
    card: str = ""
    hacks_skipped: int = 0


def _schema() -> Any:
    import pyarrow as pa

    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    return pa.schema(
        [
            ("prompt", pa.list_(message)),
            ("completion", pa.list_(message)),
            ("skill", pa.string()),
            ("task", pa.string()),
            ("problem", pa.string()),
            ("reward", pa.float64()),
            ("correct", pa.bool_()),
            ("hacked", pa.bool_()),
            ("speedup", pa.float64()),
            ("rubric", pa.float64()),
            ("test_status", pa.string()),
            ("hack_rules", pa.list_(pa.string())),
            ("declared_uses", pa.list_(pa.string())),
            ("form", pa.string()),
            ("reward_breakdown", pa.string()),
        ]
    )


_CARD = """---
configs:
- config_name: default
  default: true
  data_files:
{parquet_files}
task_categories:
- text-generation
tags:
- cuda
- kernelbench
- code
---

# CUDA kernel programs with rewards

Samples of two skills, exported by stitch-graph from verified runs:

| split | skill | rows |
| --- | --- | --- |
| `write_from_task` | write a KernelBench `ModelNew` from the reference program | {write} |
| `improve_from_feedback` | improve a program from the Verifier's feedback | {improve} |

## Columns

- `prompt`: chat messages (system, user): the reference, the plan item and, for
  `improve_from_feedback`, the previous program and the feedback.
- `completion`: the program as one assistant message (CUDA and Python code blocks).
- `reward`: R = I_correct * (1 - I_hack) * min((s + tau)(1 + lambda * r), R_max); 0 for a hack
  or a wrong result. `reward_breakdown` (JSON) holds every term; `speedup` is s, `rubric` is r.
- `correct`, `hacked`, `test_status`, `hack_rules`, `declared_uses` (ops openly left to
  PyTorch), `form` (how the program builds its kernels).
- `problem`: the reference program's text, the column a reward function reads to verify new
  completions of the same prompt.

Hacks are kept as negatives (reward 0) unless the export was asked to drop them. A split with
no rows is written as empty files but left out of `configs`, since the loader refuses empty files.

## Loading

```python
from datasets import load_dataset

ds = load_dataset("PATH")  # Parquet, through the configs above
# the same rows from the JSONL copies (the loader picks one file format per folder):
ds = load_dataset("json", data_files={jsonl_map})
```

## Rubric criteria

Write from task:

{write_criteria}
Improve from feedback:

{improve_criteria}"""


def write_dataset(
    samples: Iterable[RoundSample], out_dir: str | Path, *, include_hacks: bool = True
) -> DatasetReport:
    """Write samples as one dataset with two splits (Parquet and JSONL) and a dataset card.

    Args:
        samples: Rounds of finished runs.
        out_dir: The dataset folder; created if missing, its files replaced.
        include_hacks: Keep samples rejected as hacks (reward 0) as negatives.

    Returns:
        A :class:`DatasetReport`.

    Raises:
        ImportError: pyarrow is missing (install the ``data`` extra).
        ValueError: There is no sample to write.
    """
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        msg = "writing Parquet needs pyarrow: pip install 'stitch-graph[data]'"
        raise ImportError(msg) from exc
    folder = Path(out_dir)
    data = folder / "data"
    data.mkdir(parents=True, exist_ok=True)
    rows: dict[str, list[dict[str, Any]]] = {split: [] for split in SPLITS}
    skipped = 0
    for sample in samples:
        row = dataset_row(sample)
        if row["hacked"] and not include_hacks:
            skipped += 1
            continue
        rows[sample.skill].append(row)
    report = DatasetReport(out_dir=str(folder), hacks_skipped=skipped)
    schema = _schema()
    for split, split_rows in rows.items():
        parquet, jsonl = data / f"{split}.parquet", data / f"{split}.jsonl"
        pq.write_table(pa.Table.from_pylist(split_rows, schema=schema), parquet)
        with jsonl.open("w", encoding="utf-8") as handle:
            for row in split_rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        report.counts[split] = len(split_rows)
        report.files[split] = [str(parquet), str(jsonl)]
    present = [split for split in SPLITS if report.counts[split]]
    if not present:
        msg = "no samples to write: the runs hold no finished rounds (or only hacks, left out)"
        raise ValueError(msg)

    def files(suffix: str) -> str:
        # a split without rows is left out of the configs: the loader refuses empty files
        return "\n".join(
            f"  - split: {split}\n    path: data/{split}.{suffix}" for split in present
        )

    card = folder / "README.md"
    card.write_text(
        _CARD.replace("{parquet_files}", files("parquet"))
        .replace(
            "{jsonl_map}",
            "{" + ", ".join(f'"{p}": "PATH/data/{p}.jsonl"' for p in present) + "}",
        )
        .replace("{write}", str(report.counts["write_from_task"]))
        .replace("{improve}", str(report.counts["improve_from_feedback"]))
        .replace("{write_criteria}", criteria_text("write"))
        .replace("{improve_criteria}", criteria_text("improve"))
    )
    report.card = str(card)
    return report
