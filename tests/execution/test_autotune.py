"""Autotuning machinery on the CPU: spaces, choice by time with a scripted timer, cache keys and
reuse. The timer reads the emitted program, so a test can say which setting is fastest."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stitch_graph.codegen import (
    KernelTuning,
    Tuning,
    capture_program,
    emit_candidate,
    estimate_us,
    groups_from_plan,
    plan_program,
)
from stitch_graph.codegen.space import SPACES, narrow_space, space_kind, tuning_space
from stitch_graph.execution.autotune import TuningCache, autotune
from stitch_graph.task import load_task

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def softmax_program():
    task = load_task(ROOT / "tests/fixtures/codegen_problems/softmax_rows.py")
    ir = capture_program(task)
    return task, ir, plan_program(ir)


@pytest.fixture(scope="module")
def chain_program():
    task = load_task(ROOT / "tests/fixtures/codegen_problems/launch_bound_chain.py")
    ir = capture_program(task)
    return task, ir, plan_program(ir)


class ScriptedTimer:
    """Milliseconds from the program text: 1.0, minus a bonus per launch-bounds value seen."""

    def __init__(self, bonus: dict[int, float], fail_on: int | None = None) -> None:
        self.bonus = bonus
        self.fail_on = fail_on
        self.calls = 0

    def __call__(self, candidate) -> float | None:
        self.calls += 1
        bounds = [int(b) for b in re.findall(r"__launch_bounds__\((\d+)", candidate.kernel_source)]
        if self.fail_on is not None and self.fail_on in bounds:
            return None
        return 1.0 - sum(self.bonus.get(b, 0.0) for b in bounds)


class Clock:
    def __init__(self, step: float = 0.0) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_every_kind_declares_a_space_that_starts_with_the_current_setting():
    for kind in ("pointwise", "reduction", "softmax", "norm", "conv", "gemm", "pool", "scan", "rnn"):
        base = KernelTuning(block_size=512)
        space = tuning_space(kind, base)
        assert space[0] == base
        assert len(space) == len({s.model_dump_json() for s in space}) > 1
    assert set(SPACES) >= {"pointwise", "reduction", "softmax", "norm", "conv"}


def test_a_transposed_convolution_times_the_generated_path_first():
    assert space_kind("conv", "conv_transpose3d") == "conv_transpose"
    assert space_kind("conv", "conv2d") == "conv" and space_kind("norm", None) == "norm"
    space = tuning_space("conv_transpose", KernelTuning())
    assert space[0].conv_library and not space[1].conv_library
    assert tuning_space("conv", KernelTuning())[1].conv_library  # cuDNN's engines first


def test_a_bottleneck_moves_its_knobs_first():
    space = tuning_space("reduction")
    narrowed = narrow_space(space, "memory_bound")
    assert narrowed[0] == space[0]
    assert sorted(s.model_dump_json() for s in narrowed) == sorted(
        s.model_dump_json() for s in space
    )
    first = narrowed[1]
    assert first.vector_width != 4 or first.unroll != 1 or first.rows_per_block != 0
    assert narrow_space(space, None) == space


def test_the_fastest_setting_is_chosen_and_emitted(softmax_program):
    task, ir, plan = softmax_program
    timer = ScriptedTimer({1024: 0.5})
    tuning, report = autotune(ir, plan, task, timer, cache=None)
    program = emit_candidate(ir, plan, tuning=tuning)
    assert "__launch_bounds__(1024" in program.kernel_source
    assert report.best_ms < report.base_ms
    kernel_choices = [c for c in report.choices if c.item != "program"]
    assert kernel_choices and all(c.tried >= 1 for c in kernel_choices)
    # programs that emit the same code are timed once: fewer calls than settings in the space
    assert timer.calls <= 1 + sum(len(tuning_space(c.kind)) for c in kernel_choices) + 1


def test_noise_does_not_move_the_choice(softmax_program):
    task, ir, plan = softmax_program
    tuning, report = autotune(ir, plan, task, ScriptedTimer({1024: 0.01}), min_gain=0.03)
    assert tuning.for_item(plan.items[0].id) == KernelTuning()


def test_a_failing_setting_is_never_chosen(softmax_program):
    task, ir, plan = softmax_program
    timer = ScriptedTimer({1024: 0.9}, fail_on=1024)
    tuning, _ = autotune(ir, plan, task, timer)
    assert "__launch_bounds__(1024" not in emit_candidate(ir, plan, tuning=tuning).kernel_source


def test_a_failing_base_program_tunes_nothing(softmax_program):
    task, ir, plan = softmax_program
    tuning, report = autotune(ir, plan, task, lambda candidate: None)
    assert tuning == Tuning()
    assert "nothing tuned" in report.note


def test_the_budget_stops_tuning(chain_program):
    task, ir, plan = chain_program
    _, report = autotune(ir, plan, task, ScriptedTimer({}), budget_s=5.0, clock=Clock(step=4.0))
    assert "budget" in report.note
    # past the budget, only the first kernel class still times its first alternative
    assert [c.tried for c in report.choices if c.item != "program"] == [1]


def test_graph_replay_is_timed_even_when_the_first_build_spends_the_budget(chain_program):
    """One build of a big model can cost more than a short budget; the graph-or-not choice,
    the largest on a launch-bound model, is timed all the same, then one alternative of the
    first kernel class, and nothing after them."""
    task, ir, plan = chain_program

    def graphed_is_slower(candidate):  # the plan graphs this launch-bound chain by default
        return 1.0 if "KERNELS.graphed" in candidate.host_source else 0.5

    tuning, report = autotune(ir, plan, task, graphed_is_slower, budget_s=1.0, clock=Clock(4.0))
    program = report.choices[0]
    assert program.item == "program" and program.tried == 1
    assert [c.item for c in report.choices][:1] == ["program"] and "budget" in report.note
    assert [c.tried for c in report.choices[1:]] == [1]
    assert tuning.cuda_graph is False


def test_the_budget_includes_the_closing_confirmation(chain_program):
    """Each timing takes 3 s of a 40 s budget: the search stops early enough that the four
    confirmation timings still end inside the budget, give or take one timing."""
    task, ir, plan = chain_program
    clock = Clock()
    scripted = ScriptedTimer({512: 0.5, 128: 0.2})

    def slow(candidate):
        clock.now += 3.0
        return scripted(candidate)

    tuning, report = autotune(ir, plan, task, slow, budget_s=40.0, clock=clock)
    assert tuning != Tuning() and "not clearly faster" not in report.note  # it did confirm
    assert scripted.calls >= 6  # tuned for a while before holding back
    assert clock.now <= 40.0 + 3.0


_LIGHT_THEN_HEAVY = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, y):
        return torch.relu(x) * 2, torch.softmax(y, dim=-1)


def get_inputs():
    return [torch.randn(8, 8), torch.randn(2048, 4096)]


def get_init_inputs():
    return []
"""


def _planned(source: str):
    """The task, its captured program, its plan and each item's roofline estimate."""
    task = load_task(source)
    ir = capture_program(task)
    plan = plan_program(ir)
    return task, ir, plan, {g.id: estimate_us(ir, g) for g in groups_from_plan(ir, plan)}


def test_the_heaviest_kernels_are_tuned_first():
    task, ir, plan, cost = _planned(_LIGHT_THEN_HEAVY)
    first, last = plan.items[0].id, plan.items[-1].id
    assert cost[last] > 100 * cost[first]  # the program's order is light, then heavy
    _, report = autotune(ir, plan, task, ScriptedTimer({}))
    assert [c.item for c in report.choices] == ["program", last, first]


_COMPUTE_BOUND = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose2d(64, 64, 4, stride=2)

    def forward(self, x):
        return torch.softmax(self.up(x), dim=1)


def get_inputs():
    return [torch.randn(16, 64, 64, 64)]


def get_init_inputs():
    return []
"""


def test_a_compute_bound_program_tunes_its_kernels_before_graph_replay():
    """Two launches under a transposed convolution: the convolution is tuned first, graph
    replay last; when the budget ends after the convolution, replay is still timed."""
    task, ir, plan, cost = _planned(_COMPUTE_BOUND)
    conv = next(i.id for i in plan.items if i.kind == "conv")
    other = next(i.id for i in plan.items if i.id != conv)
    assert cost[conv] > 10 * cost[other]
    _, report = autotune(ir, plan, task, ScriptedTimer({}))
    assert [c.item for c in report.choices] == [conv, other, "program"]
    _, cut = autotune(ir, plan, task, ScriptedTimer({}), budget_s=9.0, clock=Clock(step=1.0))
    assert [c.item for c in cut.choices] == [conv, "program"]
    assert cut.choices[-1].tried >= 1 and f"spent before {other}" in cut.note


_LIGHT_GEMM_HEAVY_SOFTMAX = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, y):
        return self.fc(x), torch.softmax(y, dim=-1)


def get_inputs():
    return [torch.randn(8, 8), torch.randn(2048, 4096)]


def get_init_inputs():
    return []
"""


def test_a_library_anchor_is_tuned_before_heavier_generated_kernels():
    """Which engine (or library against generated) moves times most: a tiny GEMM goes first."""
    task, ir, plan, cost = _planned(_LIGHT_GEMM_HEAVY_SOFTMAX)
    gemm = next(i.id for i in plan.items if i.kind == "gemm")
    other = next(i.id for i in plan.items if i.id != gemm)
    assert cost[other] > 100 * cost[gemm]
    _, report = autotune(ir, plan, task, ScriptedTimer({}))
    assert [c.item for c in report.choices if c.item != "program"] == [gemm, other]


_GRU = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(4, 6, 2, batch_first=True)

    def forward(self, x, h0):
        return self.rnn(x, h0)[0]


def get_inputs():
    return [torch.randn(3, 5, 4), torch.randn(2, 3, 6)]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("cudnn_faster", [True, False])
def test_cudnns_rnn_is_a_declared_anchor_taken_only_by_time(cudnn_faster):
    task = load_task(_GRU)
    ir = capture_program(task)
    plan = plan_program(ir)

    def timer(candidate):
        on_cudnn = "torch.gru(" in candidate.host_source
        return 0.5 if on_cudnn == cudnn_faster else 1.0

    tuning, _ = autotune(ir, plan, task, timer)
    (rnn,) = [i.id for i in plan.items if i.ops and "gru" in i.ops[0]]
    program = emit_candidate(ir, plan, tuning=tuning)
    assert tuning.for_item(rnn).rnn_library is cudnn_faster
    assert ("gru" in program.declared_torch_ops) is cudnn_faster


def test_a_second_run_reuses_the_cache_without_timing(softmax_program, tmp_path):
    task, ir, plan = softmax_program
    cache = TuningCache(tmp_path)
    first, report = autotune(ir, plan, task, ScriptedTimer({512: 0.4}), cache=cache, device="G")
    assert report.choices and not any(c.cached for c in report.choices)
    assert list(tmp_path.glob("*.json"))

    def must_not_run(candidate):
        raise AssertionError("a cached choice was timed again")

    second, again = autotune(ir, plan, task, must_not_run, cache=cache, device="G")
    assert second == first
    assert again.choices and all(c.cached and c.tried == 0 for c in again.choices)
    # another GPU is another key: timed afresh
    timer = ScriptedTimer({512: 0.4})
    autotune(ir, plan, task, timer, cache=cache, device="other GPU")
    assert timer.calls > 0


def test_a_run_where_nothing_wins_reads_back_equal_from_the_cache(softmax_program, tmp_path):
    """No setting beats the defaults: the first run keeps the untuned program, and the second,
    taking every default from the cache, gives the same tuning without timing anything."""
    task, ir, plan = softmax_program
    cache = TuningCache(tmp_path)
    first, _ = autotune(ir, plan, task, ScriptedTimer({}), cache=cache)

    def must_not_run(candidate):
        raise AssertionError("a cached choice was timed again")

    second, _ = autotune(ir, plan, task, must_not_run, cache=cache)
    assert second == first == Tuning()


def test_a_search_the_budget_cut_is_searched_again_next_run(softmax_program, tmp_path):
    """Only whole searches are cached: a cut one stored as its best so far would keep the next
    run, with more budget, from ever timing the rest of the space."""
    task, ir, plan = softmax_program
    cache = TuningCache(tmp_path)
    clock = Clock()
    scripted = ScriptedTimer({1024: 0.5})

    def one_second_each(candidate):
        clock.now += 1.0
        return scripted(candidate)

    _, cut = autotune(ir, plan, task, one_second_each, cache=cache, budget_s=10.0, clock=clock)
    first = {c.item: c for c in cut.choices}
    assert "budget" in cut.note and 0 < first["k1"].tried < len(tuning_space("softmax")) - 1
    _, again = autotune(ir, plan, task, ScriptedTimer({1024: 0.5}), cache=cache)
    second = {c.item: c for c in again.choices}
    assert second["program"].cached  # searched whole in the first run
    assert not second["k1"].cached and second["k1"].tried > first["k1"].tried
    _, third = autotune(ir, plan, task, ScriptedTimer({}), cache=cache)
    assert all(c.cached for c in third.choices)  # the whole searches of run two were kept


def test_cache_keys_depend_on_what_decides_the_choice(softmax_program):
    task, ir, plan = softmax_program
    program = emit_candidate(ir, plan)
    key = TuningCache.key(program=program, item="k0", task=task, device="G", toolkit="13.0")
    assert key == TuningCache.key(program=program, item="k0", task=task, device="G", toolkit="13.0")
    others = {
        TuningCache.key(program=program, item="k1", task=task, device="G", toolkit="13.0"),
        TuningCache.key(program=program, item="k0", task=task, device="H", toolkit="13.0"),
        TuningCache.key(program=program, item="k0", task=task, device="G", toolkit="12.8"),
        TuningCache.key(
            program=program,
            item="k0",
            task=task.model_copy(update={"inputs": task.inputs[:0]}),
            device="G",
            toolkit="13.0",
        ),
        TuningCache.key(
            program=emit_candidate(ir, plan, tuning=Tuning(default=KernelTuning(block_size=128))),
            item="k0",
            task=task,
            device="G",
            toolkit="13.0",
        ),
    }
    assert key not in others and len(others) == 5


def test_an_unreadable_cache_entry_misses(tmp_path):
    cache = TuningCache(tmp_path)
    (tmp_path / "abc.json").write_text("{not json")
    assert cache.get("abc") is None
    cache.put("abc", {"setting": {}})
    assert cache.get("abc") == {"setting": {}}


class ColdThenFlat:
    """A process whose first timing is cold (10 ms) and whose 1024-thread variant looks fast
    only the first time it is timed: every later timing of any program is 1 ms."""

    def __init__(self) -> None:
        self.calls = 0
        self.seen_fast = False

    def __call__(self, candidate) -> float:
        self.calls += 1
        if self.calls == 1:
            return 10.0
        if "__launch_bounds__(1024" in candidate.kernel_source and not self.seen_fast:
            self.seen_fast = True
            return 0.5
        return 1.0


def test_the_base_time_is_taken_warm_and_graph_replay_first(softmax_program):
    task, ir, plan = softmax_program
    _, report = autotune(ir, plan, task, ScriptedTimer({}), cache=None)
    assert report.choices[0].item == "program"  # decided before any kernel
    _, cold = autotune(ir, plan, task, ColdThenFlat(), cache=None)
    assert cold.base_ms == 1.0  # the cold first timing does not count


def test_a_choice_that_does_not_hold_up_when_timed_again_is_dropped(softmax_program, tmp_path):
    task, ir, plan = softmax_program
    cache = TuningCache(tmp_path)
    tuning, report = autotune(ir, plan, task, ColdThenFlat(), cache=cache, device="G")
    assert tuning == Tuning()
    assert "untuned kept" in report.note
    source = emit_candidate(ir, plan, tuning=tuning).kernel_source
    assert "__launch_bounds__(1024" not in source
    # the cache remembers the kept setting, not the one that did not hold up
    again, _ = autotune(ir, plan, task, ScriptedTimer({}), cache=cache, device="G")
    assert "__launch_bounds__(1024" not in emit_candidate(ir, plan, tuning=again).kernel_source


def test_a_tuning_reference_is_built_where_it_runs_or_moved_there():
    import torch

    from stitch_graph.execution._common import build_on

    class Plain(torch.nn.Module):
        def __init__(self, n: int) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(n, n)

    class NeedsCpu(torch.nn.Module):
        def __init__(self, n: int) -> None:
            super().__init__()
            table = torch.arange(n).numpy()  # fails on any device but the CPU
            self.register_buffer("table", torch.as_tensor(table))

    assert build_on(Plain, [4], "meta").lin.weight.is_meta
    assert build_on(NeedsCpu, [4], "meta").table.is_meta  # built on the CPU, then moved


_REPEATED = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        for _ in range(6):
            x = torch.softmax(x * 1.5, dim=-1)
        return x.sum(dim=0)


def get_inputs():
    return [torch.randn(64, 256)]


def get_init_inputs():
    return []
"""


def test_copies_of_one_kernel_are_tuned_as_one(tmp_path):
    """Each copy alone gains 1%, under the 3% a choice needs; the four together gain 4%."""
    problem = tmp_path / "repeated.py"
    problem.write_text(_REPEATED)
    task = load_task(problem)
    ir = capture_program(task)
    plan = plan_program(ir)

    def timer(candidate):
        return 1.0 - 0.01 * len(re.findall(r"_v4\(\d+, 1024,", candidate.host_source))

    tuning, report = autotune(ir, plan, task, timer, min_gain=0.03)
    shared = [c for c in report.choices if c.copies > 1]
    assert len(shared) == 1 and shared[0].copies == 4
    copies = [i.id for i in plan.items][1:5]  # between the first (scaled input) and the last
    assert shared[0].item == copies[0]
    assert {tuning.for_item(i).block_size for i in copies} == {1024}
    assert tuning.for_item(plan.items[0].id).block_size == 256  # alone: 1%, not enough


def test_the_tuning_jobs_budget_covers_its_set_up(softmax_program, tmp_path, monkeypatch):
    """The worker's set-up (the reference every variant is checked against, the capture)
    comes out of the budget, and the report's seconds include it: a 15 s budget is a tuning
    step of about 15 s, not 15 s after a set-up of its own."""
    import time

    from stitch_graph.artifacts import TuningReport
    from stitch_graph.codegen import Tuning
    from stitch_graph.execution import autotune as tuner

    class SlowTimer:
        device, toolkit = "fake GPU", "13.0"

        def __init__(self, task, tol):
            time.sleep(0.3)  # the reference model, its inputs and outputs

    given = {}

    def fake_autotune(ir, plan, task, measure, **kwargs):
        given["budget_s"] = kwargs["budget_s"]
        return kwargs["tuning"], TuningReport(seconds=1.0, note="scripted")

    monkeypatch.setattr(tuner, "GpuTimer", SlowTimer)
    monkeypatch.setattr(tuner, "autotune", fake_autotune)
    task, _ir, plan = softmax_program
    payload = {
        "task": task.model_dump(mode="json"),
        "plan": plan.model_dump(mode="json"),
        "tuning": Tuning().model_dump(mode="json"),
        "budget_s": 2.0,
        "cache_dir": str(tmp_path),
        "tol": 1e-4,
    }
    out = tuner.run_tuning_job(payload, tmp_path)
    assert 1.0 < given["budget_s"] <= 1.7
    assert 1.3 <= out["report"]["seconds"] < 2.0


_ATTENTION_BLOCK = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(256, 768)
        self.proj = nn.Linear(256, 256)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 64).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


def get_inputs():
    return [torch.randn(4, 200, 256)]


def get_init_inputs():
    return []
"""


def test_a_fused_attention_is_tuned_before_its_projections():
    """The roofline ranks the attention below the GEMMs around it; a budget that ends early
    has still timed the fused kernel, not a GEMM's algorithms."""
    task, ir, plan, cost = _planned(_ATTENTION_BLOCK)
    _, cut = autotune(ir, plan, task, ScriptedTimer({}), budget_s=9.0, clock=Clock(step=1.0))
    first = next(c for c in cut.choices if c.item != "program")  # graph replay may go first
    assert first.kind == "attention"
    assert cost[first.item] < max(cost.values())  # the heaviest by the roofline is a GEMM
