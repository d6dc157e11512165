"""``stitch-graph verify``: the static verdict on this GPU-less machine, exit codes, JSON, and
the readable reasons a person gets for each kind of refusal."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from stitch_graph.cli import main
from stitch_graph.cli.verify import verify_files

CORPUS = Path(__file__).resolve().parent / "fixtures" / "verify_corpus"
BIAS_RELU = CORPUS / "problems" / "bias_relu.py"
LINEAR_RELU = CORPUS / "problems" / "linear_relu.py"


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    "candidate",
    ["cupy_rawkernel.py", "load_inline.py", "ctypes_nvcc_stdin.py", "project_nvrtc_bias_relu"],
)
def test_honest_forms_are_accepted_statically_and_say_the_rest_needs_a_gpu(candidate):
    code, out, _ = _run(
        ["verify", str(BIAS_RELU), str(CORPUS / "honest" / candidate), "--static-only"]
    )
    assert code == 0, out
    assert out.startswith("ACCEPTED (static checks only)")
    assert "need a GPU" in out


def test_a_hack_is_rejected_with_its_rule_and_line():
    code, out, _ = _run(["verify", str(BIAS_RELU), str(CORPUS / "hacks" / "pointer_cache.py")])
    assert code == 1
    assert out.startswith("REJECTED")
    assert "output_cache" in out and "(line " in out
    assert "nothing ran" in out


def test_json_verdict_carries_findings_and_rubric():
    code, out, _ = _run(
        ["verify", str(LINEAR_RELU), str(CORPUS / "hacks" / "tf32_switch.py"), "--json"]
    )
    verdict = json.loads(out)
    assert code == 1 and verdict["exit_code"] == 1 and verdict["verdict"] == "rejected"
    assert "precision_downgrade" in verdict["static"]["rules"]
    assert verdict["form"] == "external"
    assert verdict["rubric"]["anti_hacking"] == 1
    assert verdict["gpu"] is False and verdict["test"] is None


def test_static_json_of_an_honest_program():
    code, out, _ = _run(
        [
            "verify",
            str(LINEAR_RELU),
            str(CORPUS / "honest" / "load_inline_gemm.py"),
            "--json",
            "--static-only",
        ]
    )
    verdict = json.loads(out)
    assert code == 0 and verdict["verdict"] == "accepted"
    assert verdict["static"]["findings"] == []
    assert "need a GPU" in verdict["note"]


@pytest.mark.parametrize(
    ("problem", "candidate", "needle"),
    [
        ("missing.py", str(CORPUS / "honest" / "load_inline.py"), "no problem file"),
        (str(BIAS_RELU), "missing.py", "no candidate at"),
        (str(BIAS_RELU), str(CORPUS / "README.md"), "not a Python file"),
        (str(BIAS_RELU), str(CORPUS / "honest"), "without host.py and candidate.json"),
        (str(CORPUS.parent / "bad_problems" / "no_model.py"), str(BIAS_RELU), "does not load"),
    ],
)
def test_bad_input_exits_2_with_what_to_pass(problem, candidate, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(["verify", problem, candidate])
    assert code == 2
    assert out == ""
    assert err.startswith("BAD INPUT") and needle in err


def test_a_candidate_that_does_not_parse_is_rejected_not_bad_input(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("class ModelNew(:\n")
    verdict = verify_files(BIAS_RELU, broken, gpu=False)
    assert verdict.verdict == "rejected"
    assert verdict.static["rules"] == ["host_syntax_error"]


def test_a_run_folder_is_verified_as_its_program_not_its_export(tmp_path):
    """A run folder's model_new.py embeds the reference; program.cu + host.py are the program."""
    honest = CORPUS / "honest" / "project_nvrtc_bias_relu"
    run = tmp_path / "run"
    run.mkdir()
    (run / "program.cu").write_text((honest / "kernel.cu").read_text())
    (run / "host.py").write_text((honest / "host.py").read_text())
    (run / "model_new.py").write_text("import sys\nREFERENCE = sys.modules['__main__']\n")
    verdict = verify_files(BIAS_RELU, run, gpu=False)
    assert verdict.verdict == "accepted" and verdict.form == "nvrtc", verdict.reasons


def test_an_export_is_verified_as_the_program_it_embeds_and_only_unchanged(tmp_path):
    """The export's wrapper reads the reference and execs its host: refused in a file written
    elsewhere, so an unchanged export is checked as its program, a changed one as a file."""
    from stitch_graph.execution import export_kernelbench, load_candidate_dir
    from stitch_graph.task import load_task

    program, _ = load_candidate_dir(CORPUS / "honest" / "project_nvrtc_bias_relu")
    exported = tmp_path / "model_new.py"
    exported.write_text(export_kernelbench(program, load_task(str(BIAS_RELU))))
    verdict = verify_files(BIAS_RELU, exported, gpu=False)
    assert verdict.verdict == "accepted" and verdict.form == "nvrtc", verdict.reasons
    exported.write_text(exported.read_text().replace("super().__init__(*init_args)", "super().__init__(*init_args)  # changed"))  # noqa: E501
    verdict = verify_files(BIAS_RELU, exported, gpu=False)
    assert verdict.verdict == "rejected" and verdict.form == "external"


def test_several_candidates_give_a_list_and_the_worst_exit_status():
    code, out, _ = _run(
        [
            "verify",
            str(BIAS_RELU),
            str(CORPUS / "honest" / "cupy_rawkernel.py"),
            str(CORPUS / "hacks" / "patch_torch.py"),
            "--json",
            "--static-only",
        ]
    )
    verdicts = json.loads(out)
    assert [v["verdict"] for v in verdicts] == ["accepted", "rejected"]
    assert code == 1


def test_only_files_the_static_checks_accept_are_prebuilt(tmp_path):
    """``prebuild_files`` (``verify`` with several files, ``bench --candidates``) runs the top
    level of accepted files that build extensions; a refused file never runs, and a file that
    builds nothing is left alone. PyTorch makes an extension's folder as its build starts
    (here, without CUDA in this torch, the build itself then fails)."""
    from stitch_graph.cli.verify import prebuild_files
    from stitch_graph.execution.settings import RunSettings

    settings = RunSettings(work_dir=str(tmp_path / "work"), timeout_s=120)
    pairs = [
        (BIAS_RELU, CORPUS / "honest" / "load_inline.py"),
        (BIAS_RELU, CORPUS / "hacks" / "load_inline_aten.py"),  # refused: ATen in the extension
        (BIAS_RELU, CORPUS / "honest" / "cupy_rawkernel.py"),  # builds nothing of its own
        (BIAS_RELU, tmp_path / "missing.py"),
    ]
    assert prebuild_files(pairs, settings, jobs=2) == 1
    started = {p.name for p in (settings.root() / "torch-extensions").iterdir()}
    assert started == {"corpus_bias_relu"}
