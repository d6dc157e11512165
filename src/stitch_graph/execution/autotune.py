"""Autotuning: time each generated kernel's tuning space on the real shapes, keep the fastest.

The emitter's rules pick launch shapes from the problem's shapes; timing beats rules (this is what
Inductor's autotuner does for its Triton kernels). ``autotune`` walks the plan's kernels one after
another (coordinate descent): for each, every setting of its space (``codegen.space``) is emitted
as a whole program, settings that emit the same code are dropped unbuilt, and the rest are
measured by a ``measure`` callable that returns milliseconds, or ``None`` for a program that
fails to build, crashes or disagrees with the reference. A setting replaces the current one only
when it is clearly faster (``min_gain``), so noise does not move the choice. Library anchors
(convolutions, GEMMs, recurrent layers) go first, then the other kernels by their estimated
time. CUDA-graph replay is decided first where launches weigh (for a launch-bound program it is
the largest choice) and last elsewhere. A budget cut never skips replay, nor the first kernel's
first alternative: one build and timing of a big program can spend a short budget whole. The
first timing of a process pays for clocks ramping up and libraries loading, so the base
program is timed once to warm up before its time counts. Last, the tuned program and the base are
timed again in turns; unless the tuned one is still clearly faster, the base is kept (and cached).

Choices are cached on disk (``TuningCache``) under a key of what determines them: the program
text the kernel sits in (which holds its template and shapes), the task's input specs, the GPU and
the CUDA toolkit. A second run on the same problem and machine reuses them without timing
anything. Only searches that covered their whole space are cached: one the budget cut short is
searched again by the next run, which may have more budget. ``GpuTimer`` is the ``measure``
that runs on a GPU, with the Verifier's timing rules.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stitch_graph.artifacts import Candidate, KernelChoice, Plan, Task, TuningReport
from stitch_graph.codegen import (
    LAUNCH_US,
    EmitError,
    KernelTuning,
    Tuning,
    emit_candidate,
    estimate_us,
    group_signature,
    groups_from_plan,
)
from stitch_graph.codegen.schedule import convolves_depthwise, reduces_strided
from stitch_graph.codegen.space import narrow_space, space_kind, tuning_space
from stitch_graph.execution._common import build_on, clone_to, load_module_state, module_state
from stitch_graph.execution.executor import Executor, Job, gpu_available, run_on
from stitch_graph.execution.settings import RunSettings
from stitch_graph.runtime.problem_source import exec_problem

__all__ = [
    "GpuTimer",
    "TuningCache",
    "autotune",
    "default_cache_dir",
    "run_tuning_job",
    "tune_candidate",
    "tune_program",
    "tuning_job",
]

TUNER_VERSION = "2"
Measure = Callable[[Candidate], float | None]


def default_cache_dir() -> Path:
    """``$STITCH_TUNING_CACHE``, else ``~/.cache/stitch-graph/tuning``."""
    configured = os.environ.get("STITCH_TUNING_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "stitch-graph" / "tuning"


class TuningCache:
    """Best settings on disk, one small JSON file per key; a missing or unreadable file misses."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_cache_dir()

    @staticmethod
    def key(*, program: Candidate, item: str, task: Task, device: str, toolkit: str) -> str:
        """The digest of everything that decides the best setting of ``item`` in ``program``."""
        material = json.dumps(
            {
                "version": TUNER_VERSION,
                "kernels": program.kernel_source,
                "host": program.host_source,
                "item": item,
                "inputs": [s.model_dump() if s is not None else None for s in task.inputs],
                "input_values": task.input_values,
                "device": device,
                "toolkit": toolkit,
            },
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(material.encode()).hexdigest()[:32]

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored entry, or ``None``."""
        try:
            return json.loads((self.directory / f"{key}.json").read_text())
        except (OSError, ValueError):
            return None

    def put(self, key: str, entry: dict[str, Any]) -> None:
        """Store ``entry`` atomically (a reader never sees half a file)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".{key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(entry, sort_keys=True))
        tmp.replace(self.directory / f"{key}.json")


def _program_id(candidate: Candidate) -> str:
    return hashlib.sha256((candidate.kernel_source + candidate.host_source).encode()).hexdigest()


def autotune(
    ir: Any,
    plan: Plan,
    task: Task,
    measure: Measure,
    *,
    tuning: Tuning | None = None,
    cache: TuningCache | None = None,
    device: str = "",
    toolkit: str = "",
    bottleneck: str | None = None,
    budget_s: float = 15.0,
    min_gain: float = 0.03,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[Tuning, TuningReport]:
    """Choose every kernel's setting by timing, one kernel after another.

    Args:
        ir: The captured program (``codegen.ProgramIR``).
        plan: Its plan; every item is tuned, the most expensive (by the schedule's roofline
            estimate) first. CUDA-graph replay is decided before them on a launch-bound program,
            after them elsewhere, and whatever the budget.
        task: The task (its input specs are part of the cache key).
        measure: Milliseconds of one program on the real inputs; ``None`` when it fails or is
            wrong.
        tuning: Where to start (defaults when ``None``); it is not modified.
        cache: Where choices are read and stored; ``None``: no cache.
        device: The GPU's name, for the cache key.
        toolkit: The CUDA toolkit's version, for the cache key.
        bottleneck: A profile's bottleneck class; its knobs are tried first.
        budget_s: Time after which the remaining kernels keep their settings; the closing
            confirmation's four timings (estimated from the timings so far) are held back
            from it, so tuning ends near the budget rather than past it.
        min_gain: How much faster a setting must be to replace the current one.
        clock: Seconds, for the budget and the report (tests pass a scripted one).

    Returns:
        The chosen tuning and the report of what was tried and chosen. When every choice comes
        from the cache, nothing is measured.
    """
    started = clock()
    original = (tuning or Tuning()).model_copy(deep=True)
    metered = _Metered(measure, clock)
    tuner = _Tuner(ir, plan, metered, original.model_copy(deep=True), min_gain)

    def spent() -> bool:  # the confirmation's timings come out of the budget, not after it
        return clock() - started > budget_s - metered.confirm_s()

    report = TuningReport(device=device)
    groups = groups_from_plan(ir, plan)
    kinds = {
        group.id: space_kind(
            group.kind,
            ir.node(group.anchor).op if group.anchor else None,
            strided=reduces_strided(ir, group),
            depthwise=convolves_depthwise(ir, group),
        )
        for group in groups
    }
    # copies of one kernel (repeated layers, unrolled steps) are tuned as one: a setting is
    # timed on all of them at once, so its gain shows, and the budget is paid once
    cost = {group.id: estimate_us(ir, group) for group in groups}
    signature = {group.id: group_signature(ir, group) for group in groups}
    classes: dict[tuple[str, str], list[str]] = {}
    for entry in plan.items:
        classes.setdefault((kinds[entry.id], signature.get(entry.id, entry.id)), []).append(entry.id)
    # fused attention first, then library anchors, then the heaviest classes (roofline
    # estimate), so a budget cut leaves the light ones: which engine, or the library against
    # the generated path, moved KernelBench L2 rows by up to 2x, where block sizes moved them
    # by a few percent, and a roofline misjudges cuDNN's transposed 3-D convolutions by ten
    # times and more. The roofline ranks an attention below its projections' GEMMs, and two
    # unseen attention blocks (H100) spent a 1.5 s budget on those before reaching it
    order = sorted(
        classes.items(),
        key=lambda c: (
            c[0][0] != "attention",
            c[0][0] not in _LIBRARY_KINDS,
            -sum(cost.get(i, 0.0) for i in c[1]),
        ),
    )
    program = (("cuda_graph", ""), [_PROGRAM])
    # graph replay first only where launches weigh: on a compute-bound program one more build
    # of it would spend a short budget before the kernel that decides the time
    launch_bound = _launch_bound(len(plan.items), sum(cost.values()))
    timed: list[tuple[str, str, bool]] = []  # (cache key, item, whole space searched) this run
    first = order[0][1][0] if order else None
    for (kind, _), items in [program, *order] if launch_bound else [*order, program]:
        item = items[0]
        if spent() and item not in (_PROGRAM, first):
            report.note = report.note or f"budget of {budget_s:.0f} s spent before {item}"
            continue
        key = TuningCache.key(
            program=tuner.program, item=item, task=task, device=device, toolkit=toolkit
        )
        stored = cache.get(key) if cache is not None else None
        if stored is not None:
            tuner.apply(items, stored["setting"])
            choice = KernelChoice(
                item=item,
                kind=kind,
                setting=tuner.changed(item),
                tried=0,
                base_ms=stored.get("base_ms"),
                best_ms=stored.get("best_ms"),
                cached=True,
                copies=len(items),
            )
        else:
            if not timed and tuner.warm_up() is None:
                report.note = "the untuned program failed or was wrong; nothing tuned"
                break
            base_ms = tuner.current_ms()
            space = (
                [{"cuda_graph": g} for g in (True, False)]
                if item == _PROGRAM
                else [
                    s.model_dump()
                    for s in narrow_space(
                        tuning_space(kind, tuner.tuning.for_item(item)), bottleneck
                    )
                ]
            )
            # graph replay or not is timed whatever the budget: on a launch-bound model it is
            # the largest choice, and one build of a big program can cost a short budget whole;
            # so is the first class's first alternative, for the same reason
            stop = _never if item == _PROGRAM else spent
            if item == first:
                stop = _after_one(metered, spent)
            tried, complete = tuner.search(items, space, stop)
            choice = KernelChoice(
                item=item,
                kind=kind,
                setting=tuner.changed(item),
                tried=tried,
                base_ms=base_ms,
                best_ms=tuner.current_ms(),
                copies=len(items),
            )
            # a search the budget cut short is no choice to keep: the next run searches again
            timed.append((key, item, complete))
            if cache is not None and complete:
                cache.put(
                    key,
                    {
                        "setting": tuner.setting(item),
                        "base_ms": base_ms,
                        "best_ms": tuner.current_ms(),
                    },
                )
        report.choices.append(choice)
    if timed and tuner.tuning.pruned() != original.pruned() and not tuner.confirm(original):
        report.note = (report.note + "; " if report.note else "") + (
            "timed again in turns, the tuned program was not clearly faster: untuned kept"
        )
        for choice in report.choices:
            choice.setting, choice.best_ms = {}, choice.base_ms
        for key, item, complete in timed if cache is not None else ():
            if not complete:
                continue
            cache.put(key, {"setting": tuner.setting(item), "base_ms": None, "best_ms": None})
    measured = [c for c in report.choices if not c.cached]
    report.base_ms = measured[0].base_ms if measured else None
    report.best_ms = measured[-1].best_ms if measured else None
    report.seconds = clock() - started
    return tuner.tuning.pruned(), report


_PROGRAM = "program"
_LAUNCH_BOUND_SHARE = 0.05
# kinds whose first alternative is a library path or another kernel structure: tuned first
_LIBRARY_KINDS = frozenset({"conv", "conv_transpose", "conv_depthwise", "gemm", "rnn", "attention"})


def _after_one(metered: _Metered, spent: Callable[[], bool]) -> Callable[[], bool]:
    """``spent``, but never before ``metered`` has timed one more program."""
    start = metered.calls
    return lambda: metered.calls > start and spent()


def _launch_bound(launches: int, device_us: float) -> bool:
    """Whether launches cost at least a twentieth of the program's estimated device time, so
    that replaying it as a CUDA graph could be its largest choice."""
    return launches * LAUNCH_US >= _LAUNCH_BOUND_SHARE * device_us


def _never() -> bool:
    return False


class _Metered:
    """``measure``, keeping how long its calls take (build, check and timing together), so the
    budget can hold back what the final confirmation will cost."""

    def __init__(self, measure: Measure, clock: Callable[[], float]) -> None:
        self.measure, self.clock = measure, clock
        self.calls, self.seconds = 0, 0.0

    def __call__(self, candidate: Candidate) -> float | None:
        begun = self.clock()
        try:
            return self.measure(candidate)
        finally:
            self.calls += 1
            self.seconds += self.clock() - begun

    def confirm_s(self) -> float:
        """What ``_Tuner.confirm`` will take: two programs timed twice each."""
        return 4 * self.seconds / self.calls if self.calls else 0.0


class _Tuner:
    """The tuning being chosen, the program it emits, and that program's measured time."""

    def __init__(
        self, ir: Any, plan: Plan, measure: Measure, tuning: Tuning, min_gain: float
    ) -> None:
        self.ir, self.plan, self.measure, self.tuning = ir, plan, measure, tuning
        self.min_gain = min_gain
        self.program = emit_candidate(ir, plan, tuning=tuning)
        self._ms: float | None = None
        self._measured = False

    def current_ms(self) -> float | None:
        """The current program's time, measured on first need."""
        if not self._measured:
            self._ms, self._measured = self.measure(self.program), True
        return self._ms

    def warm_up(self) -> float | None:
        """Time the current program twice and keep the second: the first pays for the
        process's cold start. ``None`` when it fails."""
        if self.measure(self.program) is None:
            return None
        self._measured = False
        return self.current_ms()

    def confirm(self, base: Tuning, turns: int = 2) -> bool:
        """Time the tuned program and ``base``'s in turns; keep the tuned one only when its
        lower median is still faster than ``base``'s by ``min_gain``, else go back to ``base``."""
        base_program = emit_candidate(self.ir, self.plan, tuning=base)
        tuned_ms: list[float] = []
        base_ms: list[float] = []
        for _ in range(turns):
            for program, times in ((base_program, base_ms), (self.program, tuned_ms)):
                ms = self.measure(program)
                times.append(ms if ms is not None else float("inf"))
        tuned, untuned = sorted(tuned_ms)[(turns - 1) // 2], sorted(base_ms)[(turns - 1) // 2]
        if tuned < untuned * (1.0 - self.min_gain):
            self._ms = tuned
            return True
        self.tuning, self.program, self._ms = base, base_program, untuned
        return False

    def setting(self, item: str) -> dict[str, Any]:
        """The item's full setting (for the cache)."""
        if item == _PROGRAM:
            return {"cuda_graph": self.tuning.cuda_graph}
        return self.tuning.for_item(item).model_dump()

    def changed(self, item: str) -> dict[str, Any]:
        """The item's knobs that differ from the defaults (for the report)."""
        if item == _PROGRAM:
            graphed = self.tuning.cuda_graph
            return {"cuda_graph": self.plan.host.cuda_graph if graphed is None else graphed}
        defaults = KernelTuning()
        setting = self.tuning.for_item(item)
        return {k: v for k, v in setting.model_dump().items() if getattr(defaults, k) != v}

    def _with(self, items: list[str], setting: dict[str, Any]) -> Tuning:
        trial = self.tuning.model_copy(deep=True)
        if items == [_PROGRAM]:
            trial.cuda_graph = setting["cuda_graph"]
        else:
            knobs = KernelTuning.model_validate(setting)
            trial.kernels.update({item: knobs.model_copy() for item in items})
        return trial

    def apply(self, items: list[str], setting: dict[str, Any]) -> None:
        """Take a stored setting for ``items`` (one kernel and its copies) without measuring."""
        self.tuning = self._with(items, setting)
        self.program = emit_candidate(self.ir, self.plan, tuning=self.tuning)
        self._measured = False

    def search(
        self, items: list[str], space: list[dict[str, Any]], spent: Callable[[], bool]
    ) -> tuple[int, bool]:
        """Time each distinct program of ``space``, each setting given to all of ``items``;
        keep the clearly fastest. Returns how many programs were timed, and whether the whole
        space was (``False``: the budget ended)."""
        seen = {_program_id(self.program)}
        tried = 0
        complete = True
        for setting in space:
            if spent():
                complete = False
                break
            trial = self._with(items, setting)
            try:
                candidate = emit_candidate(self.ir, self.plan, tuning=trial)
            except EmitError:
                continue
            ident = _program_id(candidate)
            # a setting must not leave more to PyTorch, unless it names a library anchor
            anchored = bool(setting.get("rnn_library"))
            same_ops = candidate.declared_torch_ops == self.program.declared_torch_ops
            if ident in seen or not (same_ops or anchored):
                continue
            seen.add(ident)
            tried += 1
            ms = self.measure(candidate)
            current = self.current_ms()
            if ms is not None and current is not None and ms < current * (1.0 - self.min_gain):
                self.tuning, self.program, self._ms = trial, candidate, ms
        if items != [_PROGRAM]:  # explicit, so a run from the cache gives an equal tuning
            chosen = self.tuning.for_item(items[0])
            self.tuning.kernels.update({item: chosen.model_copy() for item in items})
        return tried, complete


# ----------------------------------------------------------------------------------------------
# Measuring on a GPU


class GpuTimer:
    """``measure`` on a GPU: build the program, check it on ``draws`` draws, time it like a round.

    The reference is built once (seeded as the Verifier seeds it) and its outputs on each draw
    kept; each program is built with NVRTC, loaded with the reference's weights, compared with
    the reference's outputs on every draw, then timed on the first with CUDA events, L2 flushed
    and inputs refilled before each run. Several draws because a library engine's rounding can
    move a value across a threshold (``hardshrink``, a comparison) on one draw and not another:
    the judge takes three. Anything that raises is a failed program, never the end of tuning.
    """

    def __init__(
        self,
        task: Task,
        *,
        tol: float = 1e-4,
        runs: int = 10,
        seed: int = 7,
        max_s: float | None = 0.25,
        draws: int = 3,
    ) -> None:
        import torch

        from stitch_graph.execution.timing import make_flush_buffer

        # judged in true FP32, as the Verifier judges: a TF32 reference would fail every variant
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        self._torch = torch
        self.tol = tol
        self.runs = runs
        self.max_s = max_s  # seconds of timed runs a variant at most (three runs at least)
        namespace = exec_problem(task.source, task.path or "<task>", f"stitch_tune_{task.digest}")
        self._init = list(task.init_args) or list(namespace.get("get_init_inputs", list)())
        torch.manual_seed(0)
        self._reference = build_on(namespace["Model"], self._init, "cuda")
        self._get_inputs = namespace["get_inputs"]
        self._seeds = [seed + k for k in range(max(draws, 1))]
        self.inputs = self._draw(seed)
        self._clean = [x.clone() if torch.is_tensor(x) else x for x in self.inputs]
        # copies: a model that writes into its inputs may return them (an optimiser step
        # returns its parameters), and the refills before each run would change them; the
        # later draws' inputs are drawn again when a variant is checked, not kept
        self._expected = [
            clone_to(self._outputs(self._reference, self.inputs, seed), "cuda"),
            *(clone_to(self._outputs(self._reference, self._draw(later), later), "cuda")
              for later in self._seeds[1:]),
        ]
        self._flush = make_flush_buffer()
        self.device = torch.cuda.get_device_name()
        self.toolkit = str(torch.version.cuda)

    def _draw(self, seed: int) -> list[Any]:
        torch = self._torch
        torch.manual_seed(seed)
        with torch.device("cuda"), torch.no_grad():
            raw = self._get_inputs()
        return [x.cuda() if torch.is_tensor(x) else x for x in raw]

    def _outputs(self, model: Any, inputs: list[Any], seed: int) -> list[Any]:
        """``model``'s outputs on ``inputs``, seeded so that draws made in forward match."""
        with self._torch.no_grad():
            self._torch.manual_seed(seed)
            got = model(*inputs)
        return list(got) if isinstance(got, list | tuple) else [got]

    def _refill(self, _run: int) -> None:
        for dst, src in zip(self.inputs, self._clean, strict=True):
            if self._torch.is_tensor(dst):
                dst.copy_(src)

    def time(self, fn: Callable[..., Any]) -> float:
        """Median milliseconds of ``fn(*inputs)`` under the round's timing rules."""
        from stitch_graph.execution.timing import time_cuda

        with self._torch.no_grad():
            # one warm-up call: ``agrees`` has just run the program once; a slow program is
            # timed fewer times, so that one variant cannot take a short budget whole
            stats = time_cuda(
                lambda: fn(*self.inputs),
                warmup=1,
                warmup_s=0.02,
                runs=self.runs,
                before_each=self._refill,
                flush_buffer=self._flush,
                max_s=self.max_s,
            )
        return stats["median_ms"]

    def load(self, candidate: Candidate) -> Any:
        """The candidate's ``ModelNew`` on the GPU with the reference's weights."""
        from stitch_graph.runtime.kernels import KernelLibrary

        host: dict[str, Any] = {
            "KERNELS": KernelLibrary(candidate.kernel_source),
            "__name__": "stitch_tuned",
        }
        exec(compile(candidate.host_source, "<tuning variant>", "exec"), host)  # noqa: S102
        model = build_on(host["ModelNew"], self._init, "cuda")  # its weights come next
        load_module_state(model, module_state(self._reference))
        model.train(self._reference.training)
        return model

    def agrees(self, model: Any) -> bool:
        """Whether ``model`` matches the reference's outputs on every draw, the timed one
        first (it rejects most wrong variants at the cost of one forward)."""
        self._refill(0)
        for k, seed in enumerate(self._seeds):
            inputs = self.inputs if k == 0 else self._draw(seed)
            if not self._matches(self._outputs(model, inputs, seed), self._expected[k]):
                return False
        return True

    def _matches(self, got: list[Any], expected: list[Any]) -> bool:
        torch = self._torch
        return len(got) == len(expected) and all(
            torch.is_tensor(g)
            and g.shape == e.shape
            and g.dtype == e.dtype
            and bool(torch.allclose(g, e, atol=self.tol, rtol=self.tol, equal_nan=True))
            for g, e in zip(got, expected, strict=True)
        )

    def __call__(self, candidate: Candidate) -> float | None:
        try:
            model = self.load(candidate)
            if not self.agrees(model):
                return None
            return self.time(model)
        except Exception:  # noqa: BLE001 - a variant that fails is not chosen
            return None


def tune_program(
    task: Task,
    ir: Any,
    plan: Plan,
    *,
    cache: TuningCache | None = None,
    budget_s: float = 15.0,
    bottleneck: str | None = None,
    timer: GpuTimer | None = None,
) -> tuple[Candidate, Tuning, TuningReport]:
    """Tune on this process's GPU and emit the tuned program.

    Returns:
        The tuned candidate, its tuning, and the report.
    """
    timer = timer or GpuTimer(task)
    tuning, report = autotune(
        ir,
        plan,
        task,
        timer,
        cache=cache if cache is not None else TuningCache(),
        device=timer.device,
        toolkit=timer.toolkit,
        bottleneck=bottleneck,
        budget_s=budget_s,
    )
    return emit_candidate(ir, plan, tuning=tuning), tuning, report


# ----------------------------------------------------------------------------------------------
# In an isolated worker


def tuning_job(
    task: Task,
    plan: Plan,
    tuning: Tuning,
    settings: RunSettings,
    *,
    bottleneck: str | None = None,
    budget_s: float = 15.0,
    cache_dir: str | None = None,
) -> Job:
    """The worker job that tunes ``plan``'s kernels on the task's real shapes."""
    return Job(
        kind="tune",
        payload={
            "task": task.model_dump(mode="json"),
            "plan": plan.model_dump(mode="json"),
            "tuning": tuning.model_dump(mode="json"),
            "bottleneck": bottleneck,
            "budget_s": budget_s,
            "cache_dir": cache_dir or str(default_cache_dir()),
            "tol": max(settings.atol, settings.rtol),
        },
        # tuning stops itself at its budget; the rest is capture, the reference and builds
        timeout_s=budget_s + max(settings.timeout_s, 120.0),
        memory_limit_mb=settings.worker_memory_mb,
        env={"CUPY_CACHE_DIR": str(settings.root() / "cupy-cache")},
    )


def run_tuning_job(payload: dict[str, Any], scratch: Path) -> dict[str, Any]:
    """Worker handler of ``tune`` jobs: capture, time every setting, return the choice.

    The budget covers the job's set-up too (the capture, and the reference model, inputs and
    outputs every variant is checked against: 5-6 s of a whole model's 21 s tuning job on an
    H200 when they came on top of a 15 s budget), and so does the report's ``seconds``.
    """
    from stitch_graph.codegen import capture_program

    started = time.perf_counter()
    task = Task.model_validate(payload["task"])
    plan = Plan.model_validate(payload["plan"])
    timer = GpuTimer(task, tol=payload["tol"])
    ir = capture_program(task)
    setup_s = time.perf_counter() - started
    tuning, report = autotune(
        ir,
        plan,
        task,
        timer,
        tuning=Tuning.model_validate(payload["tuning"]),
        cache=TuningCache(payload["cache_dir"]),
        device=timer.device,
        toolkit=timer.toolkit,
        bottleneck=payload.get("bottleneck"),
        budget_s=max(0.0, payload["budget_s"] - setup_s),
    )
    report = report.model_copy(update={"seconds": report.seconds + setup_s})
    return {"tuning": tuning.model_dump(mode="json"), "report": report.model_dump(mode="json")}


def tune_candidate(
    task: Task,
    plan: Plan,
    tuning: Tuning,
    ctx: Any = None,
    *,
    bottleneck: str | None = None,
    budget_s: float = 15.0,
    executor: Executor | None = None,
) -> tuple[Tuning | None, TuningReport]:
    """Tune the rule-generated program of ``plan`` in an isolated worker on the GPU.

    Args:
        task: The problem (its inputs give the real shapes).
        plan: The plan whose items the generator emits.
        tuning: The settings the program has now.
        ctx: ``StitchContext``, ``RunSettings`` or ``None``.
        bottleneck: The profile's bottleneck class; its knobs are tried first.
        budget_s: Seconds of tuning at most.
        executor: Where the worker runs; a private one when ``None``.

    Returns:
        The chosen tuning (``None`` when nothing could be tuned) and the report; without a GPU
        the report says so and nothing runs.
    """
    if not gpu_available():
        return None, TuningReport(note="not run: no GPU")
    settings = RunSettings.from_context(ctx)
    job = tuning_job(task, plan, tuning, settings, bottleneck=bottleneck, budget_s=budget_s)
    result = run_on(executor, job)
    if result.status != "ok" or "error" in result.result:
        reason = result.result.get("error") or result.reason or result.status
        return None, TuningReport(note=f"tuning failed: {str(reason)[:300]}")
    return (
        Tuning.model_validate(result.result["tuning"]),
        TuningReport.model_validate(result.result["report"]),
    )
