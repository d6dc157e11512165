"""The reward as TRL calls it: code taken out of string and chat completions, hacks and missing
code worth 0, verification batched through the given verifier, R as the formula says."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from stitch_graph.artifacts import OutputCheck, TestResult, TimingResult
from stitch_graph.execution import VerificationOutcome
from stitch_graph.reward import KernelReward, RewardConfig, extract_candidate, extract_model_new

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "verify_corpus"
PROBLEM = (CORPUS / "problems" / "bias_relu.py").read_text()
HONEST = (CORPUS / "honest" / "cupy_rawkernel.py").read_text()
HACK = (CORPUS / "hacks" / "torch_in_forward.py").read_text()


def fenced(code: str, lang: str = "python") -> str:
    return f"Here is the program.\n\n```{lang}\n{code}```\nIt fuses the add and the ReLU."


class ScriptedVerifier:
    """Returns a scripted speedup per candidate; records calls and how many ran at once."""

    def __init__(self, speedup: float = 2.0, correct: bool = True) -> None:
        self.speedup, self.correct = speedup, correct
        self.calls: list[str] = []
        self.running = self.peak = 0
        self._lock = threading.Lock()

    def __call__(self, task, candidate):
        with self._lock:
            self.calls.append(candidate.form)
            self.running += 1
            self.peak = max(self.peak, self.running)
        time.sleep(0.05)
        with self._lock:
            self.running -= 1
        status = "passed" if self.correct else "failed"
        test = TestResult(status=status, outputs=[OutputCheck(index=0)])
        timing = TimingResult(
            status="passed" if self.correct else "not_run",
            candidate_ms=1.0,
            eager_ms=self.speedup,
            compile_ms=self.speedup,
        )
        return VerificationOutcome(test=test, timing=timing)


def test_code_comes_out_of_strings_and_chat_messages():
    assert extract_model_new(fenced(HONEST)).startswith('"""Honest')
    chat = [{"role": "assistant", "content": fenced(HONEST)}]
    assert "class ModelNew" in extract_model_new(chat)
    parts = [{"role": "assistant", "content": [{"type": "text", "text": fenced(HONEST)}]}]
    assert "class ModelNew" in extract_model_new(parts)
    two = fenced("def helper():\n    pass\n") + fenced(HONEST)
    assert "class ModelNew" in extract_model_new(two)
    assert extract_model_new("I cannot write this.") is None
    assert extract_model_new(fenced("print('no model')\n")) is None


def test_a_cuda_block_with_kernels_makes_the_projects_own_form():
    cuda = 'extern "C" __global__ void k(float* y) { y[0] = 1.f; }\n'
    host = "class ModelNew:\n    def forward(self, x):\n        KERNELS.k(1, 1, x)\n"
    candidate = extract_candidate(fenced(cuda, "cuda") + fenced(host))
    assert candidate.form == "nvrtc" and candidate.kernel_source == cuda
    assert extract_candidate(fenced(HONEST)).form == "external"


def test_rewards_follow_the_formula_and_zero_hacks_and_missing_code():
    verifier = ScriptedVerifier(speedup=2.0)
    config = RewardConfig(tau=0.1, lam=0.5, r_max=10.0)
    reward = KernelReward({"bias_relu": PROBLEM}, config=config, verifier=verifier)
    completions = [fenced(HONEST), fenced(HACK), "no code here"]
    values = reward(["p"] * 3, completions, problem=["bias_relu"] * 3)
    assert len(values) == 3
    honest = reward.last[0]
    assert honest.correct and not honest.hacked
    assert values[0] == pytest.approx((2.0 + 0.1) * (1 + 0.5 * honest.rubric))
    assert values[1] == 0.0 and reward.last[1].hacked and "torch_compute" in reward.last[1].reason
    assert values[2] == 0.0 and "no ModelNew" in reward.last[2].reason
    assert verifier.calls == ["external"]  # the hack never ran


def test_a_batch_is_verified_in_parallel_and_wrong_results_score_zero():
    verifier = ScriptedVerifier(correct=False)
    reward = KernelReward({"bias_relu": PROBLEM}, verifier=verifier, parallel=4)
    chat = [[{"role": "assistant", "content": fenced(HONEST)}] for _ in range(4)]
    assert reward(["p"] * 4, chat) == [0.0] * 4  # one problem: no column needed
    assert verifier.peak > 1


def test_problem_text_in_the_column_and_clear_errors():
    reward = KernelReward(verifier=ScriptedVerifier())
    assert reward(["p"], [fenced(HONEST)], problem=[PROBLEM])[0] > 0
    with pytest.raises(KeyError, match="give the dataset a column"):
        reward(["p"], [fenced(HONEST)])
    with pytest.raises(TypeError, match="gpu_verifier"):
        KernelReward({"bias_relu": PROBLEM})
    assert reward.__name__ == "stitch_kernel_reward"


def test_a_verifier_that_prebuilds_gets_the_batch_first():
    """A verifier with ``prebuild`` (``gpu_verifier()``'s) is handed the batch's candidates that
    passed the static checks before any is verified, with the batch's parallelism."""
    order: list[str] = []

    class Prebuilding(ScriptedVerifier):
        def prebuild(self, candidates, *, jobs):
            order.append(f"prebuild {len(candidates)} x{jobs}")

        def __call__(self, task, candidate):
            order.append("verify")
            return super().__call__(task, candidate)

    reward = KernelReward({"bias_relu": PROBLEM}, verifier=Prebuilding(), parallel=3)
    reward(["p"] * 3, [fenced(HONEST), fenced(HACK), fenced(HONEST)])
    assert order == ["prebuild 2 x3", "verify", "verify"]
