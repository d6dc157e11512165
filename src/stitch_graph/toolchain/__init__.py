"""Compiler and profiler tools the Verifier calls: nvcc builds and Nsight Compute profiles.

Plain functions that never raise on a failed build or profile; they return the artefacts of
``stitch_graph.artifacts`` so agents (and the LangChain tool wrappers) see structured results.
"""

from stitch_graph.toolchain.ncu import (
    classify_bottleneck,
    find_ncu,
    ncu_command,
    ncu_profile,
    parse_ncu_csv,
    parse_ncu_rules,
    summarize_profile,
)
from stitch_graph.toolchain.nvcc import (
    find_nvcc,
    nvcc_compile,
    nvcc_compile_parts,
    nvcc_version,
    parse_diagnostics,
    parse_ptxas_resources,
)

__all__ = [
    "classify_bottleneck",
    "find_ncu",
    "find_nvcc",
    "ncu_command",
    "ncu_profile",
    "nvcc_compile",
    "nvcc_compile_parts",
    "nvcc_version",
    "parse_diagnostics",
    "parse_ncu_csv",
    "parse_ncu_rules",
    "parse_ptxas_resources",
    "summarize_profile",
]
