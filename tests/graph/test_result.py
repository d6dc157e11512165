"""The structured result of a run for a program left partly to PyTorch, without a GPU."""

from __future__ import annotations

from stitch_graph.agents.finalize import build_report, build_result, torch_call_sites
from stitch_graph.artifacts import Candidate, Task, TestResult

HOST = """
import torch


class ModelNew(torch.nn.Module):
    def forward(self, x):
        a = torch.linalg.inv(x)
        b = torch.linalg.inv(x * 2.0)
        c = torch.linalg.inv(x + 1.0)
        return KERNELS.k0(a, b, c)
"""


def test_call_sites_are_counted_once_per_call_under_the_first_declared_name():
    assert torch_call_sites(HOST, ["linalg_inv", "inv"]) == {"linalg_inv": 3}
    assert torch_call_sites(HOST, ["torch.linalg.inv", "cumsum"]) == {
        "torch.linalg.inv": 3,
        "cumsum": 0,
    }
    assert torch_call_sites("def broken(:", ["inv"]) == {"inv": 0}


def test_a_partial_program_that_only_compiled_is_partial_in_summary_and_result():
    program = Candidate(
        kernel_source='extern "C" __global__ void k0() {}',
        host_source=HOST,
        declared_torch_ops=["linalg_inv", "inv"],
    )
    state = {
        "task": Task(name="inverted", source="", inputs=[], outputs=[]),
        "last_compiled": program,
        "test_result": TestResult(status="not_run", reason="not run: no GPU"),
        "rounds": 1,
    }
    report = build_report(state)
    assert report.outcome == "compiled_only"
    assert report.summary.startswith("inverted: partial program (left to PyTorch, declared: ")
    assert "linalg_inv (3 call sites)" in report.summary
    result = build_result(state, report)
    assert result["partial"] is True and result["ops_left_to_pytorch"] == {"linalg_inv": 3}
    assert result["correctness"]["correct"] is None and result["correctness"]["status"] == "not_run"
    assert result["speedup_vs_eager"] is None and result["speedup_vs_compile"] is None
    assert result["program"]["host_source"] == HOST
    assert result["files"] == {} and result["run_dir"] is None


def test_write_run_from_what_invoke_returned(tmp_path):
    from stitch_graph import write_run

    program = Candidate(kernel_source="// k", host_source="class ModelNew: ...")
    state = {"task": Task(name="t", source="", inputs=[], outputs=[]), "last_compiled": program}
    report = build_report(state)
    output = {"report": report, "result": build_result(state, report)}  # no task, no state
    files = write_run(output, tmp_path / "run")
    assert files["program.cu"].read_text() == "// k"
    assert files["host.py"].read_text() == "class ModelNew: ..."
    assert "task=" in files["model_new.error.txt"].read_text()
    assert (tmp_path / "run" / "report.md").read_text().startswith("# t: compiled_only")
