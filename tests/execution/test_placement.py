"""Placement records and the check that no two timings shared a GPU at once (synthetic records
and real CPU jobs through a recording local executor)."""

from __future__ import annotations

from stitch_graph.execution import Job, LocalGPUExecutor
from stitch_graph.execution.placement import (
    Placement,
    RecordingExecutor,
    job_needs_gpu,
    shared_gpu_overlaps,
)


def _rec(node: str, gpu: str | None, start: float, end: float, **extra) -> Placement:
    return Placement(
        kind=extra.pop("kind", "candidate"), node=node, gpu=gpu, start=start, end=end, **extra
    )


def test_jobs_one_after_another_on_a_gpu_do_not_overlap():
    records = [_rec("n1", "0", 0, 1), _rec("n1", "0", 1, 2), _rec("n1", "1", 0.5, 1.5)]
    assert shared_gpu_overlaps(records) == []


def test_two_jobs_on_one_gpu_at_once_are_found():
    first, second = _rec("n1", "0", 0, 2), _rec("n1", "0", 1.5, 3)
    other_node = _rec("n2", "0", 0, 3)  # GPU 0 of another machine is another GPU
    assert shared_gpu_overlaps([second, other_node, first]) == [(first, second)]


def test_cpu_jobs_and_a_problem_with_its_own_jobs_never_clash():
    records = [
        _rec("n1", None, 0, 5),
        _rec("n1", None, 1, 2),
        _rec("n1", "3", 0, 10, kind="problem", tag="a.py"),
        _rec("n1", "3", 1, 2, tag="a.py"),
    ]
    assert shared_gpu_overlaps(records) == []
    assert len(shared_gpu_overlaps([*records, _rec("n1", "3", 4, 5, tag="b.py")])) == 1


def test_a_job_seeing_two_gpus_clashes_with_either():
    assert len(shared_gpu_overlaps([_rec("n", "0,1", 0, 2), _rec("n", "1", 1, 3)])) == 1


def test_which_jobs_need_a_gpu():
    assert job_needs_gpu(Job(kind="candidate"))
    assert not job_needs_gpu(Job(kind="candidate", payload={"device": "cpu"}))
    assert not job_needs_gpu(Job(kind="probe"))


def test_the_recording_executor_records_each_job_before_its_result_is_seen():
    pool = LocalGPUExecutor(gpus=[], prestart=False)
    recorded = RecordingExecutor(pool, tag="p.py")
    try:
        futures = [recorded.submit(Job(kind="probe", timeout_s=60)) for _ in range(2)]
        results = [f.result() for f in futures]
        assert all(r.status == "ok" for r in results)
        assert len(recorded.records) == 2  # already there when result() returned
    finally:
        pool.shutdown()
    for record in recorded.records:
        assert record.kind == "probe" and record.tag == "p.py" and record.start < record.end
