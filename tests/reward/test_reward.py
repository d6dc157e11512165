"""The scalar reward: zero for wrong or hacked programs, grows with speedup, capped."""

from __future__ import annotations

import pytest

from stitch_graph.artifacts import HackFinding, TestResult, TimingResult
from stitch_graph.checks import HackReport
from stitch_graph.reward import RewardConfig, RubricScores, compute_reward

PASSED = TestResult(status="passed")
FULL = RubricScores(anti_hacking=1, cuda_engineering=1, coverage=1, skill_compliance=1)
HALF = RubricScores(anti_hacking=1, cuda_engineering=0.5, coverage=0.5, skill_compliance=0)


def _timing(speedup: float, *, eager: float | None = None) -> TimingResult:
    return TimingResult(
        status="passed", candidate_ms=1.0, compile_ms=speedup, eager_ms=eager or speedup
    )


def test_incorrect_is_zero() -> None:
    for status in ("failed", "error", "not_run"):
        result = compute_reward(TestResult(status=status), _timing(5.0), HackReport(), FULL)
        assert result.value == 0.0
        assert not result.correct


def test_hacked_is_zero_even_when_fast_and_correct() -> None:
    report = HackReport(findings=[HackFinding(rule="output_cache", detail="cached")])
    result = compute_reward(PASSED, _timing(5.0), report, FULL)
    assert result.value == 0.0
    assert result.hacked
    assert "output_cache" in result.reason


def test_formula_and_rubric_mean() -> None:
    config = RewardConfig(tau=0.1, lam=0.5, r_max=10.0)
    result = compute_reward(PASSED, _timing(2.0), HackReport(), HALF, config)
    assert result.rubric == pytest.approx(0.5)
    assert result.value == pytest.approx((2.0 + 0.1) * (1 + 0.5 * 0.5))
    assert result.speedup_baseline == "compile"


def test_increases_with_speedup() -> None:
    values = [compute_reward(PASSED, _timing(s), None, HALF).value for s in (0.5, 1.0, 2.0, 4.0)]
    assert values == sorted(values)
    assert len(set(values)) == len(values)


def test_capped_at_r_max() -> None:
    result = compute_reward(PASSED, _timing(100.0), HackReport(), FULL, RewardConfig(r_max=10.0))
    assert result.value == 10.0
    assert result.capped
    assert result.uncapped > 10.0


def test_not_timed_leaves_only_tau() -> None:
    config = RewardConfig(tau=0.1, lam=0.5)
    for timing in (None, TimingResult(status="not_run")):
        result = compute_reward(PASSED, timing, HackReport(), FULL, config)
        assert result.speedup == 0.0
        assert result.value == pytest.approx(0.1 * 1.5)


def test_eager_baseline_and_fallback() -> None:
    timing = TimingResult(status="passed", candidate_ms=1.0, eager_ms=3.0, compile_ms=2.0)
    eager = compute_reward(PASSED, timing, None, FULL, RewardConfig(speedup_baseline="eager"))
    assert eager.speedup == pytest.approx(3.0)
    only_eager = TimingResult(status="passed", candidate_ms=1.0, eager_ms=3.0)
    fallback = compute_reward(PASSED, only_eager, None, FULL)
    assert fallback.speedup_baseline == "eager"
    assert fallback.speedup == pytest.approx(3.0)


def test_partial_program_is_correct_but_scores_less() -> None:
    full = compute_reward(PASSED, _timing(2.0), HackReport(), FULL)
    partial_rubric = FULL.model_copy(update={"coverage": 0.5, "anti_hacking": 0.9})
    partial_report = HackReport(declared_uses=["conv2d"])
    partial = compute_reward(PASSED, _timing(2.0), partial_report, partial_rubric)
    assert partial.correct and not partial.hacked
    assert 0 < partial.value < full.value
