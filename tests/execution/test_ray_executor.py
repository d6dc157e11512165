"""The Ray executor on a local CPU cluster: CPU-device jobs give the local executor's results,
each with the node and time it ran; a bench sweep on Ray equals the local one."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from stitch_graph.artifacts import Candidate, Task  # noqa: E402
from stitch_graph.execution import (  # noqa: E402
    LocalGPUExecutor,
    RunSettings,
    gpu_available,
    verify_candidate,
)
from stitch_graph.execution.placement import shared_gpu_overlaps  # noqa: E402
from stitch_graph.execution.ray_executor import RayExecutor  # noqa: E402
from tests.execution.cpu_programs import HONEST, HOST, PROBLEM  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster():
    # no GPUs even on a GPU machine: these are CPU jobs, and a GPU job would wait forever
    ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False)
    executor = RayExecutor()  # joins the running cluster, does not own it
    yield executor
    executor.shutdown()
    ray.shutdown()


def _candidate(body: str) -> Candidate:
    return Candidate(kernel_source="", host_source=HOST.format(body=body))


@pytest.mark.parametrize(
    "body",
    [HONEST, "        return torch.relu(self.lin(x)) * 1.01", "        raise ValueError('nope')"],
    ids=["honest", "wrong", "exception"],
)
def test_cpu_jobs_on_ray_give_the_local_executors_results(cluster, tmp_path, body):
    task = Task(name="lin_relu", source=PROBLEM)
    outcomes = []
    for name, executor in (("local", LocalGPUExecutor(gpus=[], prestart=False)), ("ray", cluster)):
        settings = RunSettings(work_dir=str(tmp_path / name), timeout_s=60)
        outcomes.append(
            verify_candidate(task, _candidate(body), settings, executor=executor, device="cpu")
        )
        if name == "local":
            executor.shutdown()
    local, on_ray = outcomes
    assert on_ray.test.status == local.test.status
    assert on_ray.test.reason == local.test.reason
    assert on_ray.test.trials == local.test.trials
    assert on_ray.test.outputs == local.test.outputs


def test_every_ray_job_says_where_and_when_it_ran(cluster):
    before = len(cluster.records)
    task = Task(name="lin_relu", source=PROBLEM)
    settings = RunSettings(timeout_s=60)
    verify_candidate(task, _candidate(HONEST), settings, executor=cluster, device="cpu")
    records = cluster.records[before:]
    assert {r.kind for r in records} >= {"candidate"}
    node = ray.get_runtime_context().get_node_id()
    assert all(r.node == node and r.gpu is None and r.start < r.end for r in records)
    assert shared_gpu_overlaps(records) == []


@pytest.mark.skipif(gpu_available(), reason="the compile-only sweep; GPU sweeps are timed anew")
def test_a_bench_sweep_on_ray_equals_the_local_one(cluster, tmp_path):
    from stitch_graph.cli import main

    suite = tmp_path / "suite"
    for rel in ("elementwise/01_swish_scale_shift.py", "norm/02_rms_norm.py"):
        (suite / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "problems" / rel, suite / rel)
    rows = {}
    for name, extra in (("local", []), ("ray", ["--ray", "auto"])):
        out = tmp_path / name
        argv = ["bench", str(suite), "--out", str(out), "--no-knowledge", "--max-rounds", "2"]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            assert main(argv + extra) == 0
        lines = (out / "rows.jsonl").read_text().splitlines()
        rows[name] = {r["problem"]: r for r in map(json.loads, lines) if "problem" in r}
    same = ("outcome", "correct", "rounds", "summary", "candidate_ms")
    assert rows["ray"].keys() == rows["local"].keys()
    for problem, local in rows["local"].items():
        assert {k: rows["ray"][problem].get(k) for k in same} == {k: local.get(k) for k in same}
        assert [p["kind"] for p in rows["ray"][problem]["placement"]] == ["problem"]


class _FakeRemote:
    """Stands in for the Ray task: records the resources asked for, answers at once."""

    def __init__(self):
        self.asked = []

    def options(self, **resources):
        self.asked.append(resources)
        return self

    def remote(self, job_json):
        from concurrent.futures import Future

        from stitch_graph.execution import Job

        done = Future()
        kind = Job.model_validate_json(job_json).kind
        placement = {"kind": kind, "node": "n", "gpu": "5", "start": 1.0, "end": 2.0}
        done.set_result({"result": {"status": "ok", "gpu": "5"}, "placement": placement})
        return type("Ref", (), {"future": lambda self: done})()


def test_gpu_jobs_ask_ray_for_one_gpu_and_cpu_jobs_for_one_cpu(cluster, monkeypatch):
    from stitch_graph.execution import Job

    fake = _FakeRemote()
    monkeypatch.setattr(cluster, "_remote", fake)
    gpu_result = cluster.submit(Job(kind="candidate")).result()
    cluster.submit(Job(kind="reference", payload={"device": "cpu"})).result()
    assert fake.asked == [{"num_gpus": 1, "num_cpus": 0}, {"num_cpus": 1}]
    assert gpu_result.gpu == "5" and gpu_result.placement.gpu == "5"
