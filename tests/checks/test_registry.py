"""The rule registry: built-in rules are complete, and new rules plug in without wiring."""

from __future__ import annotations

import ast

import pytest

from stitch_graph.artifacts import Candidate
from stitch_graph.checks import (
    HACK_RULES,
    REGISTRY,
    Check,
    Findings,
    FunctionContext,
    HostContext,
    Registry,
    Rule,
    Scope,
    builtin_registry,
    check_candidate,
)

KERNEL = """
extern "C" __global__ void scale(const float* __restrict__ x, float* __restrict__ out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 2.f * x[i];
}
"""

HOST = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        n = x.numel()
        KERNELS.scale((n + 255) // 256, 256, x, out, n)
        return out
"""

HOST_WITH_PRINT = HOST.replace("        return out", "        print(n)\n        return out")


def _candidate(host: str = HOST) -> Candidate:
    return Candidate(kernel_source=KERNEL, host_source=host)


def _check_print(node: ast.AST, fn: FunctionContext, out: Findings) -> None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
        out.add("host_print", "prints in the forward path", node)


PRINT_RULE = Rule("host_print", "The forward path prints, which syncs and slows timing.")
PRINT_CHECK = Check("prints", Scope.FUNCTION, _check_print, per_node=True)


def _snapshot(registry: Registry) -> tuple[dict[str, Rule], list[Check]]:
    return registry.rules, registry.checks()


def test_every_rule_has_a_description_and_a_check() -> None:
    assert set(HACK_RULES) == set(REGISTRY.rules)
    assert list(HACK_RULES) == sorted(HACK_RULES)
    for name, description in HACK_RULES.items():
        assert description.strip(), name
        assert REGISTRY.checks_raising(name), name
        assert all(check in REGISTRY.checks() for check in REGISTRY.checks_raising(name))


def test_every_check_serves_a_rule_and_has_a_unique_name() -> None:
    checks = REGISTRY.checks()
    assert len({check.name for check in checks}) == len(checks)
    for check in checks:
        assert REGISTRY.rules_of(check), check.name


def test_honest_candidate_is_clean_before_registering() -> None:
    assert check_candidate(_candidate(HOST_WITH_PRINT)).findings == []


def test_a_rule_registered_on_a_copy_is_reported_and_the_global_registry_is_untouched() -> None:
    before = _snapshot(REGISTRY)
    rules_before = dict(HACK_RULES)
    registry = REGISTRY.copy()
    registry.register(PRINT_RULE, PRINT_CHECK)

    report = check_candidate(_candidate(HOST_WITH_PRINT), registry=registry)
    assert [(f.rule, f.line) for f in report.findings] == [("host_print", 11)]
    assert report.rejected
    assert check_candidate(_candidate(HOST), registry=registry).findings == []

    assert _snapshot(REGISTRY) == before
    assert HACK_RULES == rules_before
    assert "host_print" in registry.descriptions()
    assert "host_print" not in REGISTRY.rules
    assert check_candidate(_candidate(HOST_WITH_PRINT)).findings == []


def test_register_then_unregister_restores_the_global_registry() -> None:
    before = _snapshot(REGISTRY)
    REGISTRY.register(PRINT_RULE, PRINT_CHECK)
    try:
        rules = {f.rule for f in check_candidate(_candidate(HOST_WITH_PRINT)).findings}
        assert rules == {"host_print"}
        assert REGISTRY.checks(Scope.FUNCTION)[-1] == PRINT_CHECK
    finally:
        assert REGISTRY.unregister("host_print") == PRINT_RULE
    assert check_candidate(_candidate(HOST_WITH_PRINT)).findings == []
    rules, checks = _snapshot(REGISTRY)
    assert rules == before[0]
    assert checks == before[1]


def test_builtin_registry_is_a_fresh_equal_copy() -> None:
    fresh = builtin_registry()
    assert fresh is not REGISTRY
    assert _snapshot(fresh) == _snapshot(REGISTRY)
    assert fresh.descriptions() == HACK_RULES


def test_unregistering_a_shared_rule_drops_only_its_findings() -> None:
    host = HOST.replace("import torch.nn as nn", "import torch.nn as nn\nimport threading, triton")
    full = {f.rule for f in check_candidate(_candidate(host)).findings}
    assert {"codegen_call", "timing_tamper"} <= full

    registry = builtin_registry()
    registry.unregister("timing_tamper")
    assert "timing_tamper" not in registry.descriptions()
    rules = {f.rule for f in check_candidate(_candidate(host), registry=registry).findings}
    assert rules == full - {"timing_tamper"}


def test_a_check_may_raise_only_its_registered_rules() -> None:
    def _check(host: HostContext, out: Findings) -> None:
        out.add("torch_compute", "raised by a check not registered for it")

    registry = builtin_registry()
    registry.register(
        Rule("misdeclared", "A rule whose check raises another rule."),
        Check("bad", Scope.MODULE, _check),
    )
    with pytest.raises(ValueError, match="torch_compute"):
        check_candidate(_candidate(), registry=registry)


def test_registration_errors() -> None:
    registry = builtin_registry()
    with pytest.raises(ValueError, match="already registered"):
        registry.register(Rule("torch_compute", "again"), PRINT_CHECK)
    with pytest.raises(ValueError, match="at least one check"):
        registry.register(PRINT_RULE)
    clash = Check("prints", Scope.MODULE, _check_print)
    registry.register(PRINT_RULE, PRINT_CHECK)
    with pytest.raises(ValueError, match="prints"):
        registry.register(Rule("other", "Another rule."), clash)
    with pytest.raises(KeyError):
        registry.unregister("no_such_rule")
    with pytest.raises(ValueError, match="syntax tree"):
        Check("walks", Scope.CUDA_SOURCE, _check_print, per_node=True)


def test_scopes_that_need_a_model_are_skipped_without_one() -> None:
    seen: list[str] = []

    def _model(host: HostContext, out: Findings) -> None:
        seen.append("model")

    def _cuda(ctx: object, out: Findings) -> None:
        seen.append("cuda")

    registry = Registry()
    registry.register(
        Rule("probe", "Records which scopes ran."),
        Check("model_probe", Scope.MODEL, _model),
        Check("cuda_probe", Scope.CUDA_SOURCE, _cuda),
    )
    assert check_candidate(_candidate("import torch\n"), registry=registry).findings == []
    assert seen == ["cuda"]
    check_candidate(_candidate(), registry=registry)
    assert seen == ["cuda", "model", "cuda"]
