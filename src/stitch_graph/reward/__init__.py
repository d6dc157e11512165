"""The StitchCUDA reward: rubric scores, the scalar reward, and training-data export."""

from stitch_graph.reward.export import (
    IMPROVE_FILE,
    WRITE_FILE,
    ExportReport,
    RoundSample,
    export_training_data,
    sample_record,
    write_task_samples,
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
    "DECLARED_USE_PENALTY",
    "IMPROVE_FILE",
    "WRITE_FILE",
    "ExportReport",
    "RewardBreakdown",
    "RewardConfig",
    "RoundSample",
    "RubricScores",
    "compute_reward",
    "export_training_data",
    "launch_configs",
    "sample_record",
    "score_anti_hacking",
    "score_coverage",
    "score_cuda_engineering",
    "score_rubric",
    "score_skill_compliance",
    "write_task_samples",
]
