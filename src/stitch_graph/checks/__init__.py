"""Checks the Verifier runs on a candidate: static hack detection before anything executes."""

from stitch_graph.checks.hacks import HACK_RULES, HackReport, check_candidate
from stitch_graph.checks.opnames import bare_op_name, op_key, op_keys

__all__ = ["HACK_RULES", "HackReport", "bare_op_name", "check_candidate", "op_key", "op_keys"]
