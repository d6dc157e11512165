"""The built-in hack rules, each registered with the checks that raise it.

This is the one place that names every rule and says which checks report it. The run order of
the checks within each scope is fixed here too, because it is the order of the findings (and,
as findings on one line are kept once per rule, which detail is kept).
"""

from __future__ import annotations

from stitch_graph.checks.dataflow import _check_keyed_caches, _check_output_flow
from stitch_graph.checks.external_checks import (
    _check_extension_compute,
    _check_library_compute,
    _check_opaque_builds,
)
from stitch_graph.checks.forward_checks import (
    _check_cache_decorators,
    _check_conditions,
    _check_kernel_launch,
    _check_method_caches,
    _check_torch_compute,
    _check_value_reads,
)
from stitch_graph.checks.kernels import _check_kernel_precision, _check_trivial_kernels
from stitch_graph.checks.module_checks import (
    _check_call_anywhere,
    _check_half_cast,
    _check_import,
    _check_patch,
    _check_reference,
    _check_side_streams,
)
from stitch_graph.checks.reference import _check_copied_reference
from stitch_graph.checks.registry import Check, Registry, Rule, Scope
from stitch_graph.checks.structure import (
    _check_forward_defined,
    _check_host_parses,
    _check_model_defined,
)

__all__ = ["HACK_RULES", "REGISTRY", "builtin_registry"]

_HOST_PARSES = Check("host_parses", Scope.CANDIDATE, _check_host_parses)
_IMPORTS = Check("imports", Scope.MODULE, _check_import, per_node=True)
_NAMES_USED = Check("names_used", Scope.MODULE, _check_reference, per_node=True)
_CALLS = Check("calls", Scope.MODULE, _check_call_anywhere, per_node=True)
_HALF_CASTS = Check("half_casts", Scope.MODULE, _check_half_cast, per_node=True)
_PATCHES = Check("patches", Scope.MODULE, _check_patch, per_node=True)
_SIDE_STREAMS = Check("side_streams", Scope.MODULE, _check_side_streams)
_OPAQUE_BUILDS = Check("opaque_builds", Scope.MODULE, _check_opaque_builds)
_EXTENSION_COMPUTE = Check("extension_compute", Scope.MODULE, _check_extension_compute)
_MODEL_DEFINED = Check("model_defined", Scope.MODULE, _check_model_defined)
_COPIED_REFERENCE = Check("copied_reference", Scope.MODEL, _check_copied_reference)
_FORWARD_DEFINED = Check("forward_defined", Scope.MODEL, _check_forward_defined)
_KERNEL_LAUNCH = Check("kernel_launch", Scope.FORWARD_PATH, _check_kernel_launch)
_CONDITIONS = Check("conditions", Scope.FUNCTION, _check_conditions)
_VALUE_READS = Check("value_reads", Scope.FUNCTION, _check_value_reads, per_node=True)
_TORCH_COMPUTE = Check("torch_compute", Scope.FUNCTION, _check_torch_compute, per_node=True)
_LIBRARY_COMPUTE = Check("library_compute", Scope.FUNCTION, _check_library_compute, per_node=True)
_CACHE_DECORATORS = Check("cache_decorators", Scope.FUNCTION, _check_cache_decorators)
_KEYED_CACHES = Check("keyed_caches", Scope.FUNCTION, _check_keyed_caches)
_OUTPUT_FLOW = Check("output_flow", Scope.FUNCTION, _check_output_flow)
_METHOD_CACHES = Check("method_caches", Scope.METHOD, _check_method_caches)
_KERNEL_PRECISION = Check("kernel_precision", Scope.CUDA_SOURCE, _check_kernel_precision)
_TRIVIAL_KERNELS = Check("trivial_kernels", Scope.CUDA_SOURCE, _check_trivial_kernels)

# Run order within each scope (scopes themselves run in Scope order).
_RUN_ORDER = (
    _HOST_PARSES,
    _IMPORTS,
    _NAMES_USED,
    _CALLS,
    _HALF_CASTS,
    _PATCHES,
    _SIDE_STREAMS,
    _OPAQUE_BUILDS,
    _EXTENSION_COMPUTE,
    _MODEL_DEFINED,
    _COPIED_REFERENCE,
    _FORWARD_DEFINED,
    _KERNEL_LAUNCH,
    _CONDITIONS,
    _VALUE_READS,
    _TORCH_COMPUTE,
    _LIBRARY_COMPUTE,
    _CACHE_DECORATORS,
    _KEYED_CACHES,
    _OUTPUT_FLOW,
    _METHOD_CACHES,
    _KERNEL_PRECISION,
    _TRIVIAL_KERNELS,
)

_RULES: tuple[tuple[Rule, tuple[Check, ...]], ...] = (
    (
        Rule(
            "codegen_call",
            "Code is generated or compiled at run time by something other than the "
            "candidate's own CUDA (torch.compile, TorchScript, Triton, CuPy's elementwise and "
            "reduction kernel builders, exec/eval, dynamic imports, torch.ops/torch._C). "
            "CuPy RawKernel/RawModule and load_inline compiling the file's own CUDA text are "
            "allowed.",
        ),
        (_IMPORTS, _NAMES_USED, _CALLS),
    ),
    (
        Rule(
            "constant_output",
            "The returned output is a constant or a fresh allocation that no kernel writes.",
        ),
        (_OUTPUT_FLOW,),
    ),
    (
        Rule(
            "declared_torch_op",
            "Informational: an op the candidate openly leaves to PyTorch "
            "(declared_torch_ops); allowed, but it lowers operator coverage.",
        ),
        (_TORCH_COMPUTE,),
    ),
    (
        Rule(
            "extension_torch_compute",
            "The C++ of a load_inline extension computes with PyTorch (torch::/at:: ops or "
            "tensor methods such as .matmul()) instead of its own kernels.",
        ),
        (_EXTENSION_COMPUTE,),
    ),
    (
        Rule(
            "host_syntax_error",
            "The host code does not parse as Python, so nothing about it can be trusted.",
        ),
        (_HOST_PARSES,),
    ),
    (
        Rule(
            "input_branch",
            "The host code reads input values (.item(), .any(), .tolist(), comparisons "
            "of tensors in conditions), so its behaviour can depend on the test data.",
        ),
        (_CONDITIONS, _VALUE_READS),
    ),
    (
        Rule(
            "library_compute",
            "A CuPy, NumPy or SciPy routine computes part of the result in the forward path "
            "instead of the candidate's own kernels.",
        ),
        (_LIBRARY_COMPUTE,),
    ),
    (
        Rule("missing_model_new", "The host code defines no ModelNew class."),
        (_MODEL_DEFINED, _FORWARD_DEFINED),
    ),
    (
        Rule("no_kernel_launch", "The forward path launches no CUDA kernel at all."),
        (_KERNEL_LAUNCH,),
    ),
    (
        Rule(
            "opaque_build",
            "The program runs native code the checks cannot read: a CuPy RawKernel/RawModule "
            "not compiled from CUDA text in the file, load_inline without CUDA sources, or a "
            "shared library the file does not build from its own CUDA text with nvcc.",
        ),
        (_OPAQUE_BUILDS,),
    ),
    (
        Rule(
            "output_cache",
            "Outputs are cached across calls (results kept on self or in globals, caches "
            "keyed by data_ptr()/id(), functools caches) instead of being computed each call.",
        ),
        (_CACHE_DECORATORS, _KEYED_CACHES, _OUTPUT_FLOW, _METHOD_CACHES),
    ),
    (
        Rule(
            "precision_downgrade",
            "The program computes in lower precision than the reference (half or "
            "bfloat16 casts, TF32 switches, half/TF32 tensor-core fragments on fp32 data).",
        ),
        (_IMPORTS, _NAMES_USED, _HALF_CASTS, _PATCHES, _KERNEL_PRECISION),
    ),
    (
        Rule(
            "reference_access",
            "The program reads the reference: imports Model or get_inputs, inspects "
            "modules, frames or the garbage collector, opens files, or copies the reference's "
            "forward.",
        ),
        (_IMPORTS, _NAMES_USED, _CALLS, _COPIED_REFERENCE),
    ),
    (
        Rule(
            "timing_tamper",
            "The program patches torch, time or builtins, creates timing events, sleeps, "
            "or starts threads or processes, any of which can distort measurement.",
        ),
        (_IMPORTS, _NAMES_USED, _CALLS, _PATCHES, _SIDE_STREAMS),
    ),
    (
        Rule(
            "torch_compute",
            "PyTorch computes part of the result in the forward path (torch or "
            "functional calls, tensor methods or arithmetic, advanced indexing, nn submodule "
            "calls) without declaring it.",
        ),
        (_TORCH_COMPUTE,),
    ),
    (
        Rule(
            "trivial_kernel",
            "The launched kernels do no real work: an empty body, or only copies or "
            "constant stores.",
        ),
        (_TRIVIAL_KERNELS,),
    ),
)


def builtin_registry() -> Registry:
    """A fresh registry holding the built-in rules and their checks.

    Returns:
        A registry independent of :data:`REGISTRY`; changing it changes nothing else.
    """
    registry = Registry()
    registry.schedule(*_RUN_ORDER)
    for rule, checks in _RULES:
        registry.register(rule, *checks)
    return registry


REGISTRY: Registry = builtin_registry()
"""The registry :func:`~stitch_graph.checks.check_candidate` uses unless given another."""

HACK_RULES: dict[str, str] = REGISTRY.descriptions()
"""Each built-in rule's name and description, sorted by name."""
