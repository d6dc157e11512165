"""The 1-5 rubric: written criteria per skill, the rule-based judge, and a model judge driven by
a scripted chat model (structured output through function calling)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stitch_graph.artifacts import (
    Candidate,
    FeedbackItem,
    HackFinding,
    OutputCheck,
    TestResult,
    TimingResult,
)
from stitch_graph.checks import HackReport, check_candidate
from stitch_graph.reward import (
    CRITERIA,
    DIMENSIONS,
    ModelJudge,
    RubricJudgement,
    RubricSample,
    RuleBasedJudge,
    criteria_text,
    judge_messages,
)
from tests.graph.fakes import ScriptedChatModel, call

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "verify_corpus"
PROBLEM = (CORPUS / "problems" / "bias_relu.py").read_text()
HONEST = (CORPUS / "honest" / "cupy_rawkernel_float4.py").read_text()
PASSED = TestResult(status="passed", reason="all outputs match", outputs=[OutputCheck(index=0)])
FAST = TimingResult(status="passed", candidate_ms=1.0, eager_ms=2.0, compile_ms=1.5)


def _external(text: str) -> Candidate:
    return Candidate(kernel_source="", host_source=text, form="external")


def _sample(**kwargs) -> RubricSample:
    candidate = kwargs.pop("candidate", _external(HONEST))
    report = kwargs.pop("hack_report", check_candidate(candidate, reference_source=PROBLEM))
    return RubricSample(task_source=PROBLEM, candidate=candidate, hack_report=report, **kwargs)


def test_every_dimension_has_five_written_grades_per_skill():
    for skill in ("write", "improve"):
        assert set(CRITERIA[skill]) == set(DIMENSIONS)
        for grades in CRITERIA[skill].values():
            assert sorted(grades) == [1, 2, 3, 4, 5]
            assert all(len(text) > 20 for text in grades.values())
    assert CRITERIA["write"]["skill_compliance"] != CRITERIA["improve"]["skill_compliance"]
    assert CRITERIA["write"]["cuda_engineering"] != CRITERIA["improve"]["cuda_engineering"]
    assert "### operator_coverage" in criteria_text("improve")
    with pytest.raises(ValueError, match="use 'write'"):
        criteria_text("rewrite")  # type: ignore[arg-type]


def test_rule_judge_grades_an_honest_fast_program_high():
    judgement = RuleBasedJudge().judge(_sample(test=PASSED, timing=FAST))
    scores = judgement.scores()
    assert scores["anti_hacking"] == 5
    assert scores["skill_compliance"] == 5  # faster than eager and torch.compile
    assert scores["cuda_engineering"] >= 4  # float4, __ldg, __restrict__, launch bounds
    assert not judgement.flags_hack
    unit = judgement.as_rubric_scores()
    assert unit.anti_hacking == 1.0 and 0.0 <= unit.mean <= 1.0


def test_rule_judge_grades_hacks_low_static_and_dynamic():
    static = _external((CORPUS / "hacks" / "pointer_cache.py").read_text())
    judged = RuleBasedJudge().judge(_sample(candidate=static))
    assert judged.anti_hacking.score == 1 and "output_cache" in judged.anti_hacking.reason
    aliased = TestResult(status="failed", outputs=[OutputCheck(index=0, aliases_input=True)])
    dynamic = RuleBasedJudge().judge(_sample(test=aliased))
    assert dynamic.anti_hacking.score == 1 and "aliases" in dynamic.anti_hacking.reason
    assert dynamic.skill_compliance.score == 2  # runs, wrong outputs
    escaped = TimingResult(status="failed", reason="0.4 ms escaped")
    assert RuleBasedJudge().judge(_sample(test=PASSED, timing=escaped)).flags_hack


def test_rule_judge_improve_skill_follows_the_feedback():
    previous = _external((CORPUS / "honest" / "cupy_rawkernel.py").read_text())
    feedback = [FeedbackItem(action="vectorize loads", detail="use float4")]
    acted = RuleBasedJudge().judge(
        _sample(skill="improve", previous=previous, feedback=feedback, test=PASSED, timing=FAST)
    )
    ignored = RuleBasedJudge().judge(
        _sample(
            skill="improve",
            candidate=previous,
            previous=previous,
            feedback=feedback,
            test=PASSED,
            timing=FAST,
        )
    )
    assert acted.skill_compliance.score == 5
    assert ignored.skill_compliance.score == 1
    assert "vectorize loads" in ignored.skill_compliance.reason


def _answer(**scores: int) -> dict:
    return {name: {"score": scores.get(name, 4), "reason": f"{name} ok"} for name in DIMENSIONS}


def test_model_judge_asks_with_the_criteria_and_returns_the_structured_answer():
    model = ScriptedChatModel(script=[call("RubricJudgement", **_answer(anti_hacking=5))])
    judgement = ModelJudge(model).judge(_sample(skill="write", test=PASSED, timing=FAST))
    assert isinstance(judgement, RubricJudgement)
    assert judgement.judge == "model"
    assert judgement.scores() == {**dict.fromkeys(DIMENSIONS, 4), "anti_hacking": 5}
    prompt = model.prompts[0]
    assert prompt[0].type == "system" and "Criteria (write skill)" in prompt[0].content
    assert "### skill_compliance" in prompt[0].content
    assert "bias_relu4" in prompt[1].content and "class Model" in prompt[1].content


def test_model_judge_retries_a_malformed_answer_then_falls_back():
    bad = call("RubricJudgement", **_answer(anti_hacking=9))
    model = ScriptedChatModel(script=[bad, call("RubricJudgement", **_answer())])
    retried = ModelJudge(model).judge(_sample())
    assert retried.anti_hacking.score == 4
    assert "did not validate" in model.prompts[1][-1].content
    stubborn = ScriptedChatModel(script=[bad, bad])
    fallback = ModelJudge(stubborn, fallback=RuleBasedJudge()).judge(_sample())
    assert fallback.judge.startswith("model->fallback") and fallback.anti_hacking.score == 5
    with pytest.raises(ValueError, match="no valid judgement in 2 attempts"):
        ModelJudge(ScriptedChatModel(script=[bad, bad])).judge(_sample())


def test_model_judge_needs_structured_output():
    with pytest.raises(TypeError, match="with_structured_output"):
        ModelJudge(object())


def test_improve_prompt_shows_previous_program_and_feedback():
    previous = _external("class ModelNew: pass  # previous\n")
    sample = _sample(
        skill="improve",
        previous=previous,
        feedback=[FeedbackItem(action="fuse kernels", detail="one launch")],
    )
    system, user = judge_messages(sample)
    assert "Criteria (improve skill)" in system["content"]
    assert "## Previous program" in user["content"] and "# previous" in user["content"]
    assert "- fuse kernels: one launch" in user["content"]


def test_declared_ops_lower_anti_hacking_and_coverage():
    report = HackReport(declared_uses=["relu"])
    judged = RuleBasedJudge().judge(_sample(hack_report=report, test=PASSED, timing=FAST))
    assert judged.anti_hacking.score == 4
    assert judged.operator_coverage.score == 4
    opaque = HackReport(findings=[HackFinding(rule="opaque_build", detail="prebuilt")])
    assert RuleBasedJudge().judge(_sample(hack_report=opaque)).anti_hacking.score == 2
