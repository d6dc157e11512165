"""An executor on Ray: jobs fan out over the GPUs of a machine or of a cluster, one GPU each.

``RayExecutor`` implements the ``Executor`` protocol of ``execution.executor``. Each job becomes a
Ray task that runs ``run_job`` (the same fresh, isolated worker process the local executor
starts) on whichever node has a free slot: ``num_gpus=1`` for jobs that use the GPU, so Ray never
gives one GPU to two timed jobs at once and pins the worker to it with ``CUDA_VISIBLE_DEVICES``;
``num_cpus=1`` for CPU-device jobs (compile-only work, CPU tests). Results are the local
executor's, plus a :class:`~stitch_graph.execution.placement.Placement` (node, GPU, start, end)
that ``shared_gpu_overlaps`` can audit.

Jobs name files by path (the problem's reference data, built programs, scratch folders), so on a
cluster of several machines the work folder must be on a file system every node mounts at the same
path, and stitch-graph must be installed on every node. Ray is an optional extra
(``pip install 'stitch-graph[ray]'``); this module imports it only when an executor is created.
"""

from __future__ import annotations

import platform
import threading
import time
from concurrent.futures import Future
from typing import Any

from stitch_graph.execution.executor import Job, JobResult, run_job
from stitch_graph.execution.placement import PlacedJobResult, Placement, job_needs_gpu

__all__ = ["RayExecutor", "connect_ray", "ray_available"]


def ray_available() -> bool:
    """Whether the ``ray`` package can be imported here."""
    import importlib.util

    return importlib.util.find_spec("ray") is not None


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        msg = (
            "the Ray executor needs the ray package, which is not installed: "
            "pip install 'stitch-graph[ray]' (or pip install ray), or leave --ray out to run "
            "on this machine's GPUs"
        )
        raise RuntimeError(msg) from exc
    return ray


def connect_ray(address: str | None, **init_kwargs: Any) -> bool:
    """Connect to a Ray cluster (or start a local one) unless already connected.

    Args:
        address: ``"auto"`` (the cluster this machine belongs to, started with ``ray start``),
            ``"local"`` or ``None`` (a new local cluster in this process), or ``HOST:PORT`` /
            ``ray://HOST:PORT``.
        init_kwargs: Passed to ``ray.init`` (``num_cpus``, ``num_gpus``, ...).

    Returns:
        Whether this call connected (so the caller should ``ray.shutdown()`` when done).
    """
    ray = _import_ray()
    if ray.is_initialized():
        return False
    init_kwargs.setdefault("include_dashboard", False)
    init_kwargs.setdefault("log_to_driver", False)
    target = None if address in (None, "local") else address
    try:
        ray.init(address=target, **init_kwargs)
    except ConnectionError as exc:
        msg = (
            f"cannot reach a Ray cluster at {address!r}: {exc}. Start one with `ray start "
            "--head` on the head node (and `ray start --address HEAD:6379` on the others), or "
            "pass --ray local for a cluster of this machine only"
        )
        raise RuntimeError(msg) from exc
    return True


def _run_remote(job_json: str) -> dict[str, Any]:
    """Body of the Ray task: run the job in a fresh worker on this node and say where."""
    import ray

    start = time.time()
    gpu_ids = [str(g) for g in ray.get_gpu_ids()]
    # Ray pins this process to its GPUs with CUDA_VISIBLE_DEVICES; the worker inherits it
    result = run_job(Job.model_validate_json(job_json), gpu=None)
    end = time.time()
    gpu = ",".join(gpu_ids) or None
    placement = Placement(
        kind=Job.model_validate_json(job_json).kind,
        node=ray.get_runtime_context().get_node_id(),
        host=platform.node(),
        gpu=gpu,
        start=start,
        end=end,
    )
    data = result.model_dump()
    data["gpu"] = gpu if gpu is not None else result.gpu
    return {"result": data, "placement": placement.model_dump()}


def _call_remote(fn: Any, args: tuple[Any, ...], kind: str, tag: str) -> tuple[Any, dict]:
    """Body of a Ray task that runs a whole piece of work (a problem) on one node."""
    import ray

    start = time.time()
    value = fn(*args)
    gpu = ",".join(str(g) for g in ray.get_gpu_ids()) or None
    placement = Placement(
        kind=kind,
        node=ray.get_runtime_context().get_node_id(),
        host=platform.node(),
        gpu=gpu,
        start=start,
        end=time.time(),
        tag=tag,
    )
    return value, placement.model_dump()


class RayExecutor:
    """Runs jobs as Ray tasks, one GPU per GPU job and one CPU per CPU job.

    Args:
        address: Where the cluster is (see :func:`connect_ray`); ignored when Ray is already
            initialised in this process.
        init_kwargs: Passed to ``ray.init`` when this executor starts the connection.

    Attributes:
        records: The placement of every finished job, in the order they finished.
    """

    def __init__(self, address: str | None = "auto", **init_kwargs: Any) -> None:
        self._ray = _import_ray()
        self._owns = connect_ray(address, **init_kwargs)
        self._remote = self._ray.remote(max_retries=0)(_run_remote)
        self._call = self._ray.remote(max_retries=0)(_call_remote)
        self._lock = threading.Lock()
        self._pending: set[Future[JobResult]] = set()
        self._closed = False
        self.records: list[Placement] = []

    def resources(self) -> dict[str, float]:
        """The cluster's total resources (``CPU``, ``GPU``, ...)."""
        return dict(self._ray.cluster_resources())

    def gpu_slots(self) -> int:
        """How many GPU jobs can run at once on the cluster."""
        return int(self.resources().get("GPU", 0))

    def submit(self, job: Job) -> Future[JobResult]:
        """Queue ``job`` on the cluster; the future resolves to a ``PlacedJobResult``."""
        with self._lock:
            if self._closed:
                msg = "RayExecutor is shut down; create a new one"
                raise RuntimeError(msg)
        options = {"num_gpus": 1, "num_cpus": 0} if job_needs_gpu(job) else {"num_cpus": 1}
        ref = self._remote.options(**options).remote(job.model_dump_json())
        future: Future[JobResult] = Future()
        with self._lock:
            self._pending.add(future)

        def finish(raw: Future[Any]) -> None:
            try:
                data = raw.result()
            except Exception as exc:  # noqa: BLE001 - a lost node or task becomes a result
                reason = f"the Ray task failed ({type(exc).__name__}: {str(exc)[:300]})"
                future.set_result(PlacedJobResult(status="crashed", reason=reason))
            else:
                placement = Placement.model_validate(data["placement"])
                with self._lock:
                    self.records.append(placement)
                future.set_result(PlacedJobResult(**data["result"], placement=placement))
            finally:
                with self._lock:
                    self._pending.discard(future)

        ref.future().add_done_callback(finish)
        return future

    def submit_call(
        self, fn: Any, *args: Any, gpu: bool, kind: str = "problem", tag: str = ""
    ) -> Future[tuple[Any, Placement]]:
        """Run ``fn(*args)`` as one Ray task holding one GPU (or one CPU when ``gpu`` is off).

        For work larger than a job: a whole problem (its graph run, its evaluations, its
        baselines) on one node and one GPU. ``fn`` must be importable on every node.

        Returns:
            A future of ``(fn's value, where it ran)``; it raises what ``fn`` raised.
        """
        options = {"num_gpus": 1, "num_cpus": 0} if gpu else {"num_cpus": 1}
        ref = self._call.options(**options).remote(fn, args, kind, tag)
        future: Future[tuple[Any, Placement]] = Future()

        def finish(raw: Future[Any]) -> None:
            try:
                value, placement = raw.result()
            except Exception as exc:  # noqa: BLE001 - handed to whoever waits
                future.set_exception(exc)
            else:
                record = Placement.model_validate(placement)
                with self._lock:
                    self.records.append(record)
                future.set_result((value, record))
            finally:
                with self._lock:
                    self._pending.discard(future)

        with self._lock:
            self._pending.add(future)
        ref.future().add_done_callback(finish)
        return future

    def shutdown(self) -> None:
        """Wait for submitted jobs; disconnect from Ray if this executor connected."""
        with self._lock:
            self._closed = True
            pending = list(self._pending)
        for future in pending:
            future.exception()  # waits; a failure was handed to its caller already
        if self._owns and self._ray.is_initialized():
            self._ray.shutdown()

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
