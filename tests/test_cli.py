"""The ``stitch-graph`` command: help, drawing, bad input, and one rule-based run on the CPU.

Everything runs the real code. The full ``optimize`` run needs ``nvcc`` and the rule-based
generator (``stitch_graph.codegen``); without a GPU its outcome is ``compiled_only``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from stitch_graph.cli import main
from stitch_graph.toolchain.nvcc import find_nvcc

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT = ROOT / "tests" / "graph" / "graph.mmd"
BAD_PROBLEM = ROOT / "tests" / "fixtures" / "bad_problems" / "no_model.py"
PROBLEM = ROOT / "problems" / "elementwise" / "01_swish_scale_shift.py"
RUN_FILES = [
    "program.cu",
    "host.py",
    "report.md",
    "report.json",
    "log.jsonl",
    "checkpoints.sqlite",
]


def flat(text: str) -> str:
    """Text with every run of whitespace made one space (rich wraps long console lines)."""
    return " ".join(text.split())


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """Run every command in an empty folder, so a default ``runs/`` lands there."""
    monkeypatch.chdir(tmp_path)


# --------------------------------------------------------------------------------------------
# Help


def test_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: stitch-graph")
    for command in ("optimize", "graph", "knowledge"):
        assert command in out


def test_optimize_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["optimize", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: stitch-graph optimize")
    for option in ("--model", "--coder-model", "--base-url", "--out", "--resume", "--no-profile"):
        assert option in out


def test_help_as_a_module():
    result = subprocess.run(
        [sys.executable, "-m", "stitch_graph.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: stitch-graph")


# --------------------------------------------------------------------------------------------
# Drawing


def test_graph_mermaid_matches_the_snapshot(capsys):
    assert main(["graph", "--format", "mermaid"]) == 0
    assert capsys.readouterr().out == SNAPSHOT.read_text() + "\n"


def test_graph_ascii(capsys):
    assert main(["graph", "--format", "ascii"]) == 0
    out = capsys.readouterr().out
    for node in ("planner", "coder", "coder_tools", "verifier", "verifier_tools", "finalize"):
        assert f"| {node} |" in out


def test_graph_mermaid_to_a_file(tmp_path, capsys):
    target = tmp_path / "graph.mmd"
    assert main(["graph", "--output", str(target)]) == 0
    assert capsys.readouterr().out == f"wrote {target}\n"
    assert target.read_text() == SNAPSHOT.read_text()


def test_graph_png_and_svg_to_files(tmp_path, capsys):
    for fmt, start in (("png", b"\x89PNG"), ("svg", b"<svg")):
        target = tmp_path / f"graph.{fmt}"
        assert main(["graph", "--format", fmt, "--output", str(target)]) == 0
        assert capsys.readouterr().out == f"wrote {target}\n"
        assert target.read_bytes().lstrip().startswith(start)


def test_graph_png_without_a_renderer(capsys, tmp_path, monkeypatch):
    from stitch_graph.graph import drawing

    monkeypatch.setattr(drawing, "_installed", lambda module: module == "grandalf")
    target = tmp_path / "graph.png"
    assert main(["graph", "--format", "png", "--output", str(target)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "stitch-graph[draw]" in captured.err and "pygraphviz" in captured.err
    assert not target.exists()


def test_graph_image_needs_an_output_file(capsys):
    assert main(["graph", "--format", "svg"]) == 2
    assert "--output" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# Bad input


def test_optimize_a_bad_problem(tmp_path, capsys):
    assert main(["optimize", str(BAD_PROBLEM)]) == 2
    err = flat(capsys.readouterr().err)
    assert "cannot load the problem" in err
    assert "no_model.py: the problem defines no `Model`" in err
    assert "Fix:" in err
    assert not (tmp_path / "runs").exists(), "no run folder for a problem that does not load"


def test_optimize_without_a_problem(capsys):
    assert main(["optimize"]) == 2
    assert "optimize needs PROBLEM.py" in flat(capsys.readouterr().err)


def test_a_missing_problem_file_names_what_the_cli_can_do(tmp_path, capsys):
    assert main(["optimize", "nothere.py"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "nothere.py does not exist" in err and "`stitch-graph optimize -`" in err
    assert "source text instead" not in err
    assert not (tmp_path / "runs").exists()


def test_the_problem_source_can_come_from_standard_input(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("import torch\n\nX = 1\n"))
    assert main(["optimize", "-"]) == 2
    err = flat(capsys.readouterr().err)
    assert "cannot load the problem" in err and "defines no `Model`" in err, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--model", "nonexistent:foo"], "cannot use --model nonexistent:foo: LangChain knows no"),
        (["--model", "openai:gpt-4.1"], "cannot use --model openai:gpt-4.1: Missing credentials"),
        (["--coder-model", "openai:gpt-4.1"], "cannot use --coder-model openai:gpt-4.1"),
    ],
)
def test_a_model_that_cannot_be_created_is_answered_in_one_line(
    argv, expected, tmp_path, monkeypatch, capsys
):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    out = tmp_path / "run"
    assert main(["optimize", str(PROBLEM), "--out", str(out), "--quiet", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith(expected), captured.err
    assert "Fix: " in captured.err and "model_provider" not in captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    assert not out.exists() and not (tmp_path / "runs").exists(), "no run folder is left"


def test_ctrl_c_before_a_run_starts_ends_quietly(tmp_path, monkeypatch, capsys):
    import stitch_graph.task

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(stitch_graph.task, "load_task", interrupted)
    assert main(["optimize", str(PROBLEM)]) == 130
    assert capsys.readouterr().err == "interrupted\n"
    assert not (tmp_path / "runs").exists()


def test_version():
    from importlib.metadata import version

    import stitch_graph

    assert stitch_graph.__version__ == version("stitch-graph")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert out.getvalue() == f"stitch-graph {stitch_graph.__version__}\n"


def test_knowledge_add_says_where_it_writes_and_follows_the_cache_variable(
    tmp_path, monkeypatch, capsys
):
    with pytest.raises(SystemExit):
        main(["knowledge", "add", "--help"])
    assert "STITCH_CACHE_DIR" in flat(capsys.readouterr().out)
    monkeypatch.setenv("STITCH_CACHE_DIR", str(tmp_path / "cache"))
    doc = tmp_path / "note.md"
    doc.write_text("# Shared memory tiles\n\nPad a shared tile by one column to avoid conflicts.\n")
    assert main(["knowledge", "add", str(doc)]) == 0
    store = tmp_path / "cache" / "knowledge" / "documents.jsonl"
    assert "Shared memory tiles" in store.read_text()
    assert f"store: {store}" in flat(capsys.readouterr().out)


def test_resume_of_an_unknown_run(capsys):
    assert main(["optimize", "--resume", "NONEXISTENT"]) == 2
    err = flat(capsys.readouterr().err)
    assert "no run to resume" in err and "NONEXISTENT" in err


def test_a_problem_with_nothing_to_generate_says_what_is_unsupported(tmp_path):
    problem = tmp_path / "inverse.py"
    problem.write_text(
        "import torch\nimport torch.nn as nn\n\n\n"
        "class Model(nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch.linalg.inv(x)\n\n\n"
        "def get_inputs():\n    return [torch.randn(4, 8, 8)]\n\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    code, stdout, stderr = _run(["optimize", str(problem), "--out", str(tmp_path / "run"),
                                 "--no-profile", "--quiet"])
    assert code == 1, stdout + stderr
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["outcome"] == "unsupported", report["summary"]
    assert "unsupported: " in report["summary"] and "inv" in report["summary"]
    assert "no program was submitted" in report["summary"]


# --------------------------------------------------------------------------------------------
# A real rule-based run


def _not_ready() -> str | None:
    if find_nvcc() is None:
        return "nvcc is needed for a real run"
    try:
        from stitch_graph.codegen import emit_candidate, plan_program  # noqa: F401
    except ImportError as exc:
        return f"stitch_graph.codegen is not ready ({exc})"
    return None


def _slow_build_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose builds take 3 s more, in an empty build cache: a run stopped
    once it starts compiling is stopped mid-build, not after a cached build has ended it."""
    wrapper = tmp_path / "slow-nvcc"
    wrapper.write_text(
        '#!/bin/sh\ncase "$*" in *--version*) ;; *) sleep 3 ;; esac\n'
        f'exec {shlex.quote(str(find_nvcc()))} "$@"\n'
    )
    wrapper.chmod(0o755)
    return {**os.environ, "STITCH_NVCC": str(wrapper), "STITCH_CACHE_DIR": str(tmp_path / "c")}


def _gpu_present() -> bool:
    try:
        from stitch_graph.execution import gpu_available
    except ImportError:
        return False
    return bool(gpu_available())


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def quick_start_argv() -> list[str]:
    """The ``stitch-graph`` command of the README's Quick start, as written there."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    command = block.splitlines()[0].split("&& ", 1)[1]
    argv = shlex.split(command)
    assert argv[0] == ".venv/bin/stitch-graph", command
    return argv[1:]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """The README's Quick start run, in an empty folder beside the problem suite; shared."""
    reason = _not_ready()
    if reason:
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("quick_start")
    (folder / "problems").symlink_to(ROOT / "problems", target_is_directory=True)
    argv = quick_start_argv()
    assert argv == ["optimize", "problems/elementwise/01_swish_scale_shift.py", "--out", "runs/swish"]
    before = os.getcwd()
    os.chdir(folder)
    try:
        return (folder / "runs" / "swish").resolve(), _run(argv)
    finally:
        os.chdir(before)


def test_optimize_rule_based(finished_run):
    out, (code, stdout, stderr) = finished_run
    assert code == 0, stdout + stderr
    for name in RUN_FILES:
        assert (out / name).is_file(), f"{name} missing; run printed:\n{stdout}{stderr}"
    report = json.loads((out / "report.json").read_text())
    assert report["task"] == "01_swish_scale_shift"
    if not _gpu_present():
        assert report["outcome"] == "compiled_only", report["summary"]
    else:
        assert report["outcome"] in ("verified", "partial"), report["summary"]
    assert report["summary"] in stdout
    assert f"outputs: {out}" in stdout
    assert "__global__" in (out / "program.cu").read_text()
    assert "ModelNew" in (out / "host.py").read_text()
    heading = f"# 01_swish_scale_shift: {report['outcome']}"
    assert (out / "report.md").read_text().startswith(heading)
    events = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    agents = {e["agent"] for e in events if "agent" in e}
    assert {"planner", "coder", "verifier", "finalize"} <= agents
    meta = json.loads((out / "run.json").read_text())
    assert meta["problem"] == str((out / "../../problems/elementwise/01_swish_scale_shift.py").resolve())
    assert meta["run_id"] == "swish" and meta["args"]["out"] == "runs/swish"


def test_resume_of_a_finished_run(finished_run):
    out, (code, _, _) = finished_run
    assert code == 0
    before = (out / "log.jsonl").read_text()
    code, stdout, stderr = _run(["optimize", "--resume", str(out)])
    assert code == 0, stdout + stderr
    assert "already finished, nothing to resume" in stdout
    assert (out / "log.jsonl").read_text() == before, "a finished run must not run again"


def test_a_killed_run_resumes_from_its_last_completed_step(tmp_path):
    """Kill the CLI mid-run (SIGKILL), then --resume: the plan is not made again."""
    import json
    import signal
    import time

    reason = _not_ready()
    if reason:
        pytest.skip(reason)

    problem = Path(__file__).resolve().parents[1] / "problems/models/05_swiglu_block.py"
    out = tmp_path / "runs" / "killed"
    command = [
        sys.executable,
        "-m",
        "stitch_graph.cli",
        "optimize",
        str(problem),
        "--out",
        str(out),
        "--no-profile",
        "--no-knowledge",
        "--quiet",
    ]
    process = subprocess.Popen(
        command,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=_slow_build_env(tmp_path),
    )
    log = out / "log.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None:
        # the Verifier has started building: the plan and the program are checkpointed
        if log.exists() and '"event": "compiling"' in log.read_text():
            break
        time.sleep(0.02)
    assert process.poll() is None, "the run ended before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (out / "report.json").exists()

    resumed = subprocess.run(
        [*command[:3], "optimize", "--resume", str(out), "--quiet"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    events = [json.loads(line) for line in log.read_text().splitlines() if '"agent"' in line]
    assert sum(e["event"] == "plan ready" for e in events) == 1, "the plan was made once"
    report = json.loads((out / "report.json").read_text())
    assert report["outcome"] == "compiled_only"
    assert set(report["details"]["items"].values()) == {"done"}


def test_ctrl_c_prints_the_resume_command_which_works_from_any_folder(tmp_path):
    """SIGINT mid-run: one line naming the command, no traceback; that command, run from
    another folder, finishes the run, and run again says it is finished."""
    import shlex
    import signal
    import time

    reason = _not_ready()
    if reason:
        pytest.skip(reason)
    started_in, elsewhere = tmp_path / "a", tmp_path / "b"
    started_in.mkdir()
    elsewhere.mkdir()
    (started_in / "problem.py").write_text(PROBLEM.read_text())
    command = [sys.executable, "-m", "stitch_graph.cli", "optimize", "problem.py"]
    process = subprocess.Popen(
        [*command, "--out", "runs/swish", "--no-profile", "--no-knowledge", "--quiet"],
        cwd=started_in,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_slow_build_env(tmp_path),
        # a shell runs background commands with SIGINT ignored, and a child inherits that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    log = started_in / "runs" / "swish" / "log.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None:
        if log.exists() and '"event": "compiling"' in log.read_text():
            break
        time.sleep(0.02)
    assert process.poll() is None, "the run ended before it could be interrupted"
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stdout + stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("interrupted: resume with ")]
    assert len(lines) == 1, stderr
    hint = lines[0].removeprefix("interrupted: resume with ")
    assert f"resume with: {hint}" in stderr, "the hint printed at the start is the same command"
    assert not (started_in / "runs" / "swish" / "report.json").exists()

    argv = shlex.split(hint)
    assert argv[:3] == ["stitch-graph", "optimize", "--resume"]
    resumed = subprocess.run(
        [sys.executable, "-m", "stitch_graph.cli", *argv[1:], "--quiet"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    report = json.loads((started_in / "runs" / "swish" / "report.json").read_text())
    assert report["summary"] in resumed.stdout
    again = subprocess.run(
        [sys.executable, "-m", "stitch_graph.cli", *argv[1:]],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr
    assert "already finished, nothing to resume" in again.stdout
    assert not (elsewhere / "runs").exists()


THRICE_INVERTED = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        a = torch.relu(torch.linalg.inv(x))
        b = torch.linalg.inv(x * 2.0)
        c = torch.linalg.inv(x + 1.0)
        return a + b + c


def get_inputs():
    return [torch.randn(4, 8, 8)]


def get_init_inputs():
    return []
"""


def test_a_partial_program_is_reported_as_partial_with_each_call_site(tmp_path):
    reason = _not_ready()
    if reason:
        pytest.skip(reason)
    problem = tmp_path / "inverted.py"
    problem.write_text(THRICE_INVERTED)
    out = tmp_path / "run"
    code, stdout, stderr = _run(
        ["optimize", str(problem), "--out", str(out), "--no-profile", "--no-knowledge", "--quiet"]
    )
    assert code == 0, stdout + stderr
    assert (out / "host.py").read_text().count("torch.linalg.inv(") == 3
    report = json.loads((out / "report.json").read_text())
    assert report["details"]["ops_left_to_pytorch"] == {"linalg_inv": 3}
    assert "partial program" in stdout and "linalg_inv (3 call sites)" in stdout, stdout
    if not _gpu_present():
        assert report["outcome"] == "compiled_only"
    else:
        assert report["outcome"] == "partial"
    markdown = (out / "report.md").read_text()
    assert "## Left to PyTorch (partial program)" in markdown
    assert "| linalg_inv | 3 |" in markdown


@pytest.mark.parametrize("command", ["optimize", "bench"])
def test_the_tuning_budget_reaches_the_run_settings(command, tmp_path):
    from stitch_graph.cli.main import build_parser
    from stitch_graph.cli.models import context_from_args

    parser = build_parser()
    default = parser.parse_args([command, "p.py"])
    given = parser.parse_args([command, "p.py", "--tune-budget", "2.5"])
    assert context_from_args(default, tmp_path).tune_budget_s == 15.0
    assert context_from_args(given, tmp_path).tune_budget_s == 2.5
