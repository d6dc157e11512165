"""The StitchCUDA reward: rubric scores and judges, the scalar reward, a GRPO reward function,
and training data (JSONL files and one dataset with two splits)."""

from stitch_graph.reward.criteria import CRITERIA, DIMENSIONS, criteria_text
from stitch_graph.reward.dataset import SPLITS, DatasetReport, write_dataset
from stitch_graph.reward.export import (
    IMPROVE_FILE,
    WRITE_FILE,
    ExportReport,
    RoundSample,
    export_training_data,
    sample_record,
    write_task_samples,
)
from stitch_graph.reward.grpo import KernelReward, extract_candidate, extract_model_new
from stitch_graph.reward.judges import (
    DimensionScore,
    ModelJudge,
    RubricJudgement,
    RubricSample,
    RuleBasedJudge,
    judge_messages,
)
from stitch_graph.reward.reward import RewardBreakdown, RewardConfig, compute_reward
from stitch_graph.reward.rubric import (
    DECLARED_USE_PENALTY,
    RubricScores,
    launch_configs,
    score_anti_hacking,
    score_coverage,
    score_cuda_engineering,
    score_rubric,
    score_skill_compliance,
)

__all__ = [
    "CRITERIA",
    "DECLARED_USE_PENALTY",
    "DIMENSIONS",
    "IMPROVE_FILE",
    "SPLITS",
    "WRITE_FILE",
    "DatasetReport",
    "DimensionScore",
    "ExportReport",
    "KernelReward",
    "ModelJudge",
    "RewardBreakdown",
    "RewardConfig",
    "RoundSample",
    "RubricJudgement",
    "RubricSample",
    "RubricScores",
    "RuleBasedJudge",
    "compute_reward",
    "criteria_text",
    "export_training_data",
    "extract_candidate",
    "extract_model_new",
    "judge_messages",
    "launch_configs",
    "sample_record",
    "score_anti_hacking",
    "score_coverage",
    "score_cuda_engineering",
    "score_rubric",
    "score_skill_compliance",
    "write_dataset",
    "write_task_samples",
]
