"""The StitchCUDA scalar reward of one candidate, with every term kept for inspection.

R = I_correct · (1 − I_hack) · min((s + τ)(1 + λ·r), R_max)

``s`` is the speedup over the chosen baseline, ``r`` the mean rubric score, ``τ`` a small offset so
that a correct but slow program still earns something, ``λ`` the rubric weight and ``R_max`` a cap
that keeps one outlier timing from dominating training. Keeping the terms (not just R) lets a
trainer or a person see why a sample scored what it did.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from stitch_graph.artifacts import HackReport, TestResult, TimingResult
from stitch_graph.reward.rubric import RubricScores

__all__ = ["RewardBreakdown", "RewardConfig", "compute_reward"]


class RewardConfig(BaseModel):
    """Constants of the reward, each configurable; where the defaults come from:

    - ``tau = 0.1``: the formula's offset, so that a correct program slower than the baseline
      still earns more than any wrong one (0.1-0.15 against 0). Set here, not taken from a
      published value; it is small next to the speedups a correct program reaches (the
      KernelBench level-2 sweep in ``results/h200-2026-12-01-kernelbench/`` has a geometric
      mean of 1.15 against ``torch.compile``).
    - ``lam = 0.5``: the rubric can raise R by at most half (r = 1 gives a factor 1.5), so
      speed stays the main signal and the rubric breaks ties between programs of similar
      speed. Set here.
    - ``r_max = 10``: about five times the largest speedup over ``torch.compile`` in the
      KernelBench rows of ``results/`` (2.1x); a larger value is far more often a timing
      accident of a microsecond program than real, and one would dominate a GRPO group's
      advantage. Set here.
    - ``speedup_baseline = "compile"``: the stronger of the two baselines the Verifier times in
      the same run, so a program is not rewarded for beating eager PyTorch only.
    """

    tau: float = Field(default=0.1, ge=0.0, description="Offset rewarding correct-but-slow code.")
    lam: float = Field(default=0.5, ge=0.0, description="Weight of the rubric score.")
    r_max: float = Field(default=10.0, gt=0.0, description="Cap on the reward.")
    speedup_baseline: Literal["eager", "compile"] = Field(
        default="compile", description="Which PyTorch time the speedup is measured against."
    )


class RewardBreakdown(BaseModel):
    """Every term of the reward and the final value."""

    correct: bool
    hacked: bool
    speedup: float = Field(description="s; 0 when timing did not run.")
    speedup_baseline: Literal["eager", "compile", "none"] = "none"
    rubric: float = Field(description="r, the mean of the four rubric criteria.")
    tau: float
    lam: float
    r_max: float
    uncapped: float = Field(description="(s + tau)(1 + lam r), before the cap and indicators.")
    capped: bool = False
    value: float
    reason: str = ""


def _speedup(
    timing: TimingResult | None, baseline: Literal["eager", "compile"]
) -> tuple[float, Literal["eager", "compile", "none"], str]:
    if timing is None or timing.status != "passed":
        return 0.0, "none", "not timed"
    preferred = timing.speedup_vs_compile if baseline == "compile" else timing.speedup_vs_eager
    if preferred is not None:
        return preferred, baseline, ""
    other: Literal["eager", "compile"] = "eager" if baseline == "compile" else "compile"
    fallback = timing.speedup_vs_eager if other == "eager" else timing.speedup_vs_compile
    if fallback is not None:
        return fallback, other, f"no {baseline} time; speedup measured against {other}"
    return 0.0, "none", "timing has no baseline time"


def compute_reward(
    test: TestResult,
    timing: TimingResult | None,
    hack_report: HackReport | None,
    rubric: RubricScores,
    config: RewardConfig | None = None,
) -> RewardBreakdown:
    """Compute R for one candidate.

    Args:
        test: Correctness result; only ``status == "passed"`` counts as correct.
        timing: Timing result; None or not passed means s = 0, so only τ counts.
        hack_report: Static hack checks; a rejected report zeroes the reward.
        rubric: The rubric scores; r is their mean. A partial program (declared ops) can be
            correct, and its lower coverage lowers r.
        config: Constants; defaults to :class:`RewardConfig`.

    Returns:
        The :class:`RewardBreakdown`.
    """
    config = config or RewardConfig()
    correct = test.status == "passed"
    hacked = bool(hack_report and hack_report.rejected)
    s, used, note = _speedup(timing, config.speedup_baseline)
    s = max(0.0, s)
    r = min(1.0, max(0.0, rubric.mean))
    uncapped = (s + config.tau) * (1.0 + config.lam * r)
    capped = uncapped > config.r_max
    value = min(uncapped, config.r_max)
    reasons = [note] if note else []
    if not correct:
        reasons.append(f"not correct ({test.status})")
        value = 0.0
    if hacked:
        reasons.append(f"hack: {', '.join(hack_report.rules)}" if hack_report else "hack")
        value = 0.0
    return RewardBreakdown(
        correct=correct,
        hacked=hacked,
        speedup=s,
        speedup_baseline=used,
        rubric=r,
        tau=config.tau,
        lam=config.lam,
        r_max=config.r_max,
        uncapped=uncapped,
        capped=capped,
        value=value,
        reason="; ".join(reasons),
    )
