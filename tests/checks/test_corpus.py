"""The verification corpus, static layer: each hack meant for the checks is caught, no honest
program is refused, and the corpus keeps the breadth it claims."""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.checks import check_candidate
from stitch_graph.execution import load_candidate_dir
from tests.tool_scripts import load_tool

ROOT = Path(__file__).resolve().parents[2]


TOOL = load_tool("eval_hack_corpus")
ENTRIES = TOOL.load_corpus(TOOL.DEFAULT_CORPUS)
HACKS = [e for e in ENTRIES if e.group == "hacks"]
HONEST = [e for e in ENTRIES if e.group == "honest"]


def test_corpus_breadth() -> None:
    """At least 20 hacks of distinct kinds and 20 honest programs over every external form."""
    assert len(HACKS) >= 20
    assert len({e.kind for e in HACKS}) >= 18
    assert len(HONEST) >= 20
    forms = {e.kind for e in HONEST}
    assert {"cupy_rawkernel", "cupy_rawmodule", "load_inline", "ctypes_nvcc"} <= forms
    assert "project_nvrtc" in forms
    for entry in HACKS:
        assert entry.layer in {"static", "dynamic"}, entry.name


@pytest.mark.parametrize("entry", [e for e in HACKS if e.layer == "static"], ids=lambda e: e.name)
def test_static_hack_is_flagged_by_its_rule(entry) -> None:
    report = check_candidate(entry.candidate, reference_source=entry.problem_source)
    assert report.rejected, f"{entry.name} passed the static checks"
    assert entry.rule in report.rules, report.findings


@pytest.mark.parametrize("entry", HONEST, ids=lambda e: e.name)
def test_honest_program_is_not_flagged(entry) -> None:
    report = check_candidate(entry.candidate, reference_source=entry.problem_source)
    assert report.findings == [], report.findings


def test_dynamic_hacks_really_pass_the_static_layer() -> None:
    """A hack marked dynamic is one the checks cannot see; if they start to, mark it static."""
    for entry in (e for e in HACKS if e.layer == "dynamic"):
        report = check_candidate(entry.candidate, reference_source=entry.problem_source)
        assert not report.rejected, f"{entry.name}: {report.findings}"


@pytest.mark.parametrize("folder", sorted((ROOT / "examples" / "candidates").iterdir()))
def test_hand_written_examples_stay_clean(folder: Path) -> None:
    candidate, meta = load_candidate_dir(folder)
    report = check_candidate(candidate, reference_source=Path(meta["problem"]).read_text())
    assert report.findings == [], report.findings


def test_static_table_counts_every_entry() -> None:
    rows = TOOL.evaluate(ENTRIES, dynamic=False)
    table = TOOL.summary(rows)
    assert table["hacks"]["total"] == len(HACKS)
    assert table["hacks"]["static"] == sum(e.layer == "static" for e in HACKS)
    assert table["honest"]["static"] == 0
    text = TOOL.render(rows, dynamic_note="skipped")
    assert "static" in text and "honest" in text
