"""The whole verify path on CPU (host code only, no kernels), and the no-GPU verdict."""

from __future__ import annotations

import json

import pytest

from stitch_graph.artifacts import Candidate, Task
from stitch_graph.execution import LocalGPUExecutor, RunSettings, verify_candidate
from tests.execution.cpu_programs import HONEST, HOST, PROBLEM


def _host(body: str) -> Candidate:
    return Candidate(kernel_source="", host_source=HOST.format(body=body))


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    settings = RunSettings(work_dir=str(tmp_path_factory.mktemp("cpu-exec")), timeout_s=60)
    pool = LocalGPUExecutor(gpus=[])
    yield Task(name="lin_relu", source=PROBLEM), settings, pool
    pool.shutdown()


def test_honest_host_code_passes_and_sees_no_secrets(env, tmp_path, monkeypatch):
    task, settings, pool = env
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fake-key")
    dump = tmp_path / "env.json"
    body = (
        f"        import json, os\n        json.dump(dict(os.environ), open({str(dump)!r}, 'w'))\n"
    )
    outcome = verify_candidate(task, _host(body + HONEST), settings, executor=pool, device="cpu")
    assert outcome.test.status == "passed", outcome.test.reason
    assert outcome.test.trials == settings.correctness_trials
    assert outcome.timing.status == "not_run"  # never timed on CPU
    assert "OPENAI_API_KEY" not in json.loads(dump.read_text())


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        ("        return torch.relu(self.lin(x)) * 1.01", "failed", "differ beyond"),
        ("        raise ValueError('nope')", "error", "Python exception: ValueError: nope"),
        ("        import ctypes\n        ctypes.string_at(0)", "error", "SIGSEGV"),
        ("        return x", "failed", "aliases an input"),
    ],
    ids=["wrong", "exception", "segfault", "alias"],
)
def test_faults_become_structured_results(env, body, status, reason):
    task, settings, pool = env
    outcome = verify_candidate(task, _host(body), settings, executor=pool, device="cpu")
    assert outcome.test.status == status
    assert reason in outcome.test.reason


def test_reference_failure_is_an_error_result(env):
    _, settings, pool = env
    broken = Task(name="broken", source=PROBLEM.replace("torch.randn(8, 16)", "torch.zeros(8, 16)"))
    outcome = verify_candidate(broken, _host(HONEST), settings, executor=pool, device="cpu")
    assert outcome.test.status == "error" and outcome.test.failed_side == "reference"
    assert outcome.test.reason.startswith("reference failed:") and "constant" in outcome.test.reason


def test_no_gpu_means_not_run(monkeypatch, env):
    task, settings, _ = env
    import stitch_graph.execution.round as verification_round

    monkeypatch.setattr(verification_round, "gpu_available", lambda: False)
    outcome = verify_candidate(task, _host(HONEST), settings)
    assert outcome.test.status == "not_run" and outcome.test.reason == "not run: no GPU"
    assert outcome.timing.status == "not_run"


def test_worker_memory_follows_the_machine_unless_set():
    from stitch_graph.execution.settings import RunSettings, machine_memory_share_mb

    share = machine_memory_share_mb()
    assert share >= 1024
    assert RunSettings().worker_memory_mb == share  # half of this machine, not a fixed 16 GiB
    assert RunSettings(memory_limit_mb=2048).worker_memory_mb == 2048
    assert machine_memory_share_mb(0.25) <= share


RANDOM_PROBLEM = PROBLEM.replace(
    "return torch.relu(self.lin(x))", "return torch.relu(self.lin(x) + torch.randn_like(x))"
)


def test_draws_made_in_forward_are_the_same_on_both_sides(env):
    """Like an LSTM's random initial state: the RNG is seeded before each trial's forward in
    both workers, although the candidate's worker also ran warm-up calls before."""
    _, settings, pool = env
    task = Task(name="lin_relu_noise", source=RANDOM_PROBLEM)
    honest = "        return torch.relu(self.lin(x) + torch.randn_like(x))"
    outcome = verify_candidate(task, _host(honest), settings, executor=pool, device="cpu")
    assert outcome.test.status == "passed", outcome.test.reason
    drop = "        return torch.relu(self.lin(x))"  # leaving the draw out is still wrong
    outcome = verify_candidate(task, _host(drop), settings, executor=pool, device="cpu")
    assert outcome.test.status == "failed"
