"""The Planner, Coder and Verifier nodes, each with a model brain and a rule-based brain."""

from stitch_graph.agents.analysis import AnalysisDraft
from stitch_graph.agents.coder import CandidateDraft, coder_node
from stitch_graph.agents.finalize import build_report, finalize_node
from stitch_graph.agents.planner import PlanDraft, planner_node
from stitch_graph.agents.verifier import verifier_node

__all__ = [
    "AnalysisDraft",
    "CandidateDraft",
    "PlanDraft",
    "build_report",
    "coder_node",
    "finalize_node",
    "planner_node",
    "verifier_node",
]
