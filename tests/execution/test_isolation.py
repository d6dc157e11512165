"""Isolation without a GPU: timeouts, crashes, memory limits and secret scrubbing of children."""

from __future__ import annotations

import json
import sys

from stitch_graph.execution import Job, run_isolated, run_job, scrub_environment


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_scrub_environment_drops_credentials():
    env = {
        "PATH": "/bin",
        "OPENAI_API_KEY": "x",
        "OPENAI_BASE_URL": "x",
        "MY_TOKEN": "x",
        "db_password": "x",
        "AWS_REGION": "x",
        "HF_HOME": "x",
        "LANGSMITH_PROJECT": "x",
        "LANGCHAIN_TRACING_V2": "x",
        "ANTHROPIC_MODEL": "x",
        "GOOGLE_CREDENTIALS": "x",
        "CLIENT_SECRET": "x",
        "CUDA_VISIBLE_DEVICES": "0",
    }
    assert scrub_environment(env) == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0"}


def test_child_sees_no_secrets(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fake")
    monkeypatch.setenv("STITCH_HARMLESS", "1")
    code = "import json, os; json.dump(dict(os.environ), open('env.json', 'w'))"
    outcome = run_isolated(_py(code), cwd=tmp_path, timeout_s=30)
    assert outcome.returncode == 0
    seen = json.loads((tmp_path / "env.json").read_text())
    assert "OPENAI_API_KEY" not in seen
    assert seen["STITCH_HARMLESS"] == "1"


def test_hanging_child_is_killed_with_its_group(tmp_path):
    code = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "time.sleep(60)\n"
    )
    outcome = run_isolated(_py(code), cwd=tmp_path, timeout_s=1.5)
    assert outcome.timed_out
    assert outcome.seconds < 10
    assert outcome.signal_name == "SIGKILL"


def test_segfault_and_abort_are_reported(tmp_path):
    segv = run_isolated(_py("import ctypes; ctypes.string_at(0)"), cwd=tmp_path / "a", timeout_s=30)
    assert segv.signal_name == "SIGSEGV"
    abort = run_isolated(_py("import os; os.abort()"), cwd=tmp_path / "b", timeout_s=30)
    assert abort.signal_name == "SIGABRT"


def test_memory_hog_is_killed(tmp_path):
    code = "import time\nblocks = []\nwhile True:\n    blocks.append(bytearray(50 << 20))\n"
    outcome = run_isolated(_py(code), cwd=tmp_path, timeout_s=30, memory_limit_mb=200)
    assert outcome.memory_exceeded
    assert outcome.peak_rss_mb > 200


def test_run_job_maps_timeout_memory_and_crash(tmp_path):
    slow = run_job(Job(kind="candidate", timeout_s=0.2, scratch_dir=str(tmp_path / "t")))
    assert slow.status == "timeout" and "timeout" in slow.reason
    hog = run_job(Job(kind="candidate", memory_limit_mb=1, scratch_dir=str(tmp_path / "m")))
    assert hog.status in ("memory", "error")  # killed, or finished before the first check
    bad = run_job(Job(kind="candidate", payload={}, scratch_dir=str(tmp_path / "e")))
    assert bad.status == "error"
    assert "KeyError" in bad.reason
