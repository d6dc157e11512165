"""The op registry: one table from a canonical op name to its kind, CUDA expression and cost.

Coverage is data, not a chain of ``if`` statements: the capture step maps every traced call to a
canonical name, the scheduler asks this table what kind of node that is, and the emitter asks it for
the scalar CUDA expression of a pointwise op. Adding an op is one ``_op(...)`` line; an op missing
from the table (or marked ``UNSUPPORTED``) stays in PyTorch, declared, and ``explain_unsupported``
says why.

Expression templates name the op's arguments (``{input}``, ``{other}``, ``{negative_slope}``, ...);
tensor operands become per-element values, Python numbers become C literals, and ``None`` takes the
argument's default from the signature string.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "INDEXED",
    "LOADS_THROUGH_PROLOGUE",
    "READS_ELSEWHERE",
    "OpInfo",
    "OpKind",
    "REGISTRY",
    "explain_unsupported",
    "lookup",
    "parse_signature",
]

OpKind = Literal[
    "pointwise",
    "reduction",
    "norm",
    "softmax",
    "gemm",
    "conv",
    "pool",
    "scan",
    "rnn",
    "scatter",
    "view",
    "identity",
    "unsupported",
]

POINTWISE: OpKind = "pointwise"
REDUCTION: OpKind = "reduction"
NORM: OpKind = "norm"
SOFTMAX: OpKind = "softmax"
GEMM: OpKind = "gemm"
CONV: OpKind = "conv"
POOL: OpKind = "pool"
SCAN: OpKind = "scan"
RNN: OpKind = "rnn"
SCATTER: OpKind = "scatter"
VIEW: OpKind = "view"
IDENTITY: OpKind = "identity"
UNSUPPORTED: OpKind = "unsupported"


def parse_signature(signature: str) -> list[tuple[str, Any]]:
    """Parse ``"input, dim=None, keepdim=False"`` into ``[(name, default), ...]``.

    A parameter without a default gets the sentinel ``...`` (required).
    """
    params: list[tuple[str, Any]] = []
    for part in filter(None, (p.strip() for p in signature.split(","))):
        name, _, default = part.partition("=")
        value: Any = ...
        if default:
            text = default.strip()
            value = float(text) if text in ("inf", "-inf") else ast.literal_eval(text)
        params.append((name.strip(), value))
    return params


@dataclass(frozen=True)
class OpInfo:
    """What the code generator knows about one canonical op.

    Attributes:
        name: Canonical op name (``relu``, ``layer_norm``, ``fft_fft``).
        kind: Node kind the scheduler uses.
        signature: Parameter names with defaults, in call order.
        expr: CUDA expression template for pointwise ops, ``None`` otherwise.
        flops: Floating-point operations per output element (planning estimate).
        reads: Elements read per output element besides the inputs' own (planning estimate).
        note: Why the op is unsupported, or how it is lowered.
        by_constant: A parameter and the templates that replace ``expr`` when the call passes
            it one of their keys as a constant (``pow`` by its exponent).
    """

    name: str
    kind: OpKind
    signature: str = "input"
    expr: str | None = None
    flops: float = 1.0
    reads: float = 0.0
    note: str = ""
    params: list[tuple[str, Any]] = field(default_factory=list, compare=False)
    by_constant: tuple[str, dict[float, str]] | None = field(default=None, compare=False)

    def template(self, args: dict[str, Any]) -> str | None:
        """The expression template for a call with these bound arguments."""
        if self.by_constant is not None:
            name, templates = self.by_constant
            value = args.get(name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                return templates.get(float(value), self.expr)
        return self.expr

    def bind(self, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Map positional and keyword call arguments onto the signature's names, with defaults."""
        names = [n for n, _ in self.params]
        bound: dict[str, Any] = {}
        for name, value in zip(names, args, strict=False):
            bound[name] = value
        if len(args) > len(names):
            bound["*extra"] = list(args[len(names) :])
        for key, value in kwargs.items():
            bound[key] = value
        for name, default in self.params:
            if bound.get(name) is None and default is not ...:
                bound[name] = default
        return bound


REGISTRY: dict[str, OpInfo] = {}
GENERATED_DTYPES = frozenset({"float32", "bool", "int64", "int32"})
"""The tensor types kernels read and write; an op on any other stays in PyTorch."""
INDEXED = frozenset(
    {
        "cat", "stack", "interleave", "flip", "gather", "index", "roll", "pad", "triu", "tril",
        "setitem", "bucketize",
    }
)
"""Pointwise ops whose value is read at another position than the output's (no expression)."""
READS_ELSEWHERE = INDEXED - {"triu", "tril"}
"""Indexed ops that read their operands at other positions than the output's (a triangle
mask reads its operand in place), so those operands must be in memory."""
LOADS_THROUGH_PROLOGUE: tuple[OpKind, ...] = ("reduction", "norm", "softmax", "pool", "scan")
"""Kinds whose kernel computes its input's pointwise producers on load (a fused prologue)."""


def _op(
    name: str,
    kind: OpKind,
    signature: str = "input",
    expr: str | None = None,
    *,
    flops: float = 1.0,
    note: str = "",
    aliases: tuple[str, ...] = (),
    by_constant: tuple[str, dict[float, str]] | None = None,
) -> None:
    info = OpInfo(
        name, kind, signature, expr, flops, 0.0, note, parse_signature(signature), by_constant
    )
    REGISTRY[name] = info
    for alias in aliases:
        REGISTRY[alias] = info


# fmt: off
# ---- pointwise, unary ------------------------------------------------------------------------
_op("relu", POINTWISE, "input, inplace=False", "sg_max({input}, 0.f)")
_op("relu6", POINTWISE, "input, inplace=False", "sg_min(sg_max({input}, 0.f), 6.f)", flops=2)
_op("gelu", POINTWISE, "input, approximate='none'", "(0.5f * {input} * (1.f + erff({input} * 0.70710678118654752f)))", flops=8)  # noqa: E501
_op("gelu_tanh", POINTWISE, "input, approximate='tanh'", "(0.5f * {input} * (1.f + tanhf(0.79788456080286536f * ({input} + 0.044715f * {input} * {input} * {input}))))", flops=12)  # noqa: E501
_op("sigmoid", POINTWISE, "input", "sg_sigmoid({input})", flops=4, aliases=("special_expit", "expit"))  # noqa: E501
_op("silu", POINTWISE, "input, inplace=False", "({input} * sg_sigmoid({input}))", flops=4)
_op("tanh", POINTWISE, "input", "tanhf({input})", flops=4)
_op("exp", POINTWISE, "input", "expf({input})", flops=2)
_op("exp2", POINTWISE, "input", "exp2f({input})", flops=2, aliases=("special_exp2",))
_op("expm1", POINTWISE, "input", "expm1f({input})", flops=2, aliases=("special_expm1",))
_op("log", POINTWISE, "input", "logf({input})", flops=2)
_op("log2", POINTWISE, "input", "log2f({input})", flops=2)
_op("log10", POINTWISE, "input", "log10f({input})", flops=2)
_op("log1p", POINTWISE, "input", "log1pf({input})", flops=2, aliases=("special_log1p",))
_op("sqrt", POINTWISE, "input", "sqrtf({input})", flops=2)
_op("rsqrt", POINTWISE, "input", "rsqrtf({input})", flops=2)
_op("abs", POINTWISE, "input", "fabsf({input})")
_op("neg", POINTWISE, "input", "(-{input})", aliases=("negative",))
_op("reciprocal", POINTWISE, "input", "(1.f / {input})")
_op("square", POINTWISE, "input", "({input} * {input})")
_op("sin", POINTWISE, "input", "sinf({input})", flops=4)
_op("cos", POINTWISE, "input", "cosf({input})", flops=4)
_op("erf", POINTWISE, "input", "erff({input})", flops=4, aliases=("special_erf",))
_op("floor", POINTWISE, "input", "floorf({input})")
_op("ceil", POINTWISE, "input", "ceilf({input})")
_op("round", POINTWISE, "input, decimals=0", "sg_round_decimals({input}, {decimals})",
    by_constant=("decimals", {0.0: "rintf({input})"}))
_op("trunc", POINTWISE, "input", "truncf({input})")
_op("logical_not", POINTWISE, "input", "(!{input})", note="bitwise_not of a bool tensor too")
_op("sign", POINTWISE, "input", "(float)(({input} > 0.f) - ({input} < 0.f))", aliases=("sgn",))
# constant exponents as PyTorch's CUDA pow computes them: products, a square root, a reciprocal
_POW_EXACT = {
    2.0: "({input} * {input})",
    3.0: "({input} * {input} * {input})",
    -2.0: "(1.f / ({input} * {input}))",
    0.5: "sqrtf({input})",
    -1.0: "(1.f / {input})",
    1.0: "({input})",
}
_op("pow", POINTWISE, "input, exponent", "powf({input}, {exponent})", flops=4, by_constant=("exponent", _POW_EXACT))
_op("clamp", POINTWISE, "input, min=-inf, max=inf", "sg_min(sg_max({input}, {min}), {max})", flops=2, aliases=("clip",))  # noqa: E501
_op("clamp_min", POINTWISE, "input, min", "sg_max({input}, {min})")
_op("clamp_max", POINTWISE, "input, max", "sg_min({input}, {max})")
_op("hardtanh", POINTWISE, "input, min_val=-1.0, max_val=1.0, inplace=False", "sg_min(sg_max({input}, {min_val}), {max_val})", flops=2)  # noqa: E501
_op("leaky_relu", POINTWISE, "input, negative_slope=0.01, inplace=False", "({input} > 0.f ? {input} : {input} * {negative_slope})", flops=2)  # noqa: E501
_op("hardswish", POINTWISE, "input, inplace=False", "({input} * sg_min(sg_max({input} + 3.f, 0.f), 6.f) / 6.f)", flops=4)  # noqa: E501
_op("hardsigmoid", POINTWISE, "input, inplace=False", "(sg_min(sg_max({input} + 3.f, 0.f), 6.f) / 6.f)", flops=3)  # noqa: E501
_op("softplus", POINTWISE, "input, beta=1.0, threshold=20.0", "({input} * {beta} > {threshold} ? {input} : sg_softplus({input} * {beta}) / {beta})", flops=6)  # noqa: E501
_op("elu", POINTWISE, "input, alpha=1.0, inplace=False", "({input} > 0.f ? {input} : {alpha} * expm1f({input}))", flops=4)  # noqa: E501
_op("selu", POINTWISE, "input, inplace=False", "(1.0507009873554805f * ({input} > 0.f ? {input} : 1.6732632423543772f * expm1f({input})))", flops=5)  # noqa: E501
_op("celu", POINTWISE, "input, alpha=1.0, inplace=False", "sg_max({input}, 0.f) + sg_min(0.f, {alpha} * expm1f({input} / {alpha}))", flops=5)  # noqa: E501
_op("mish", POINTWISE, "input, inplace=False", "sg_mish({input})", flops=8)
_op("softsign", POINTWISE, "input", "({input} / (1.f + fabsf({input})))", flops=3)
_op("logsigmoid", POINTWISE, "input", "(-sg_softplus(-{input}))", flops=5, aliases=("log_sigmoid",))  # noqa: E501
_op("tanhshrink", POINTWISE, "input", "({input} - tanhf({input}))", flops=5)
_op("softshrink", POINTWISE, "input, lambd=0.5", "({input} > {lambd} ? {input} - {lambd} : ({input} < -{lambd} ? {input} + {lambd} : 0.f))", flops=3)  # noqa: E501
_op("hardshrink", POINTWISE, "input, lambd=0.5", "(fabsf({input}) > {lambd} ? {input} : 0.f)", flops=2)  # noqa: E501
_op("frac", POINTWISE, "input", "({input} - truncf({input}))", flops=2)
_op("tan", POINTWISE, "input", "tanf({input})", flops=4)
_op("asin", POINTWISE, "input", "asinf({input})", flops=4, aliases=("arcsin",))
_op("acos", POINTWISE, "input", "acosf({input})", flops=4, aliases=("arccos",))
_op("atan", POINTWISE, "input", "atanf({input})", flops=4, aliases=("arctan",))
_op("sinh", POINTWISE, "input", "sinhf({input})", flops=4)
_op("cosh", POINTWISE, "input", "coshf({input})", flops=4)
_op("asinh", POINTWISE, "input", "asinhf({input})", flops=4, aliases=("arcsinh",))
_op("acosh", POINTWISE, "input", "acoshf({input})", flops=4, aliases=("arccosh",))
_op("atanh", POINTWISE, "input", "atanhf({input})", flops=4, aliases=("arctanh",))
_op("erfc", POINTWISE, "input", "erfcf({input})", flops=4, aliases=("special_erfc",))
_op("erfinv", POINTWISE, "input", "erfinvf({input})", flops=6, aliases=("special_erfinv",))
_op("erfcx", POINTWISE, "input", "erfcxf({input})", flops=6, aliases=("special_erfcx",))
_op("lgamma", POINTWISE, "input", "lgammaf({input})", flops=8, aliases=("special_gammaln",))
_op("i0", POINTWISE, "input", "cyl_bessel_i0f({input})", flops=8, aliases=("special_i0",))
_op("ndtr", POINTWISE, "input", "normcdff({input})", flops=4, aliases=("special_ndtr",))
_op("ndtri", POINTWISE, "input", "normcdfinvf({input})", flops=6, aliases=("special_ndtri",))
# log of the normal CDF: through erfcx below -1, where the CDF itself underflows
_op("log_ndtr", POINTWISE, "input", "({input} < -1.f ? logf(erfcxf(-{input} * 0.70710678118654752f) * 0.5f) - 0.5f * {input} * {input} : log1pf(-0.5f * erfcf({input} * 0.70710678118654752f)))", flops=8, aliases=("special_log_ndtr",))  # noqa: E501
_op("sinc", POINTWISE, "input", "({input} == 0.f ? 1.f : sinf(3.14159265358979323846f * {input}) / (3.14159265358979323846f * {input}))", flops=5, aliases=("special_sinc",))  # noqa: E501
_op("entr", POINTWISE, "input", "({input} != {input} ? {input} : ({input} > 0.f ? -{input} * logf({input}) : ({input} == 0.f ? 0.f : -SG_INF)))", flops=3, aliases=("special_entr",))  # noqa: E501
_op("nan_to_num", POINTWISE, "input, nan=0.0, posinf=3.4028234663852886e+38, neginf=-3.4028234663852886e+38", "({input} != {input} ? {nan} : ({input} == SG_INF ? {posinf} : ({input} == -SG_INF ? {neginf} : {input})))", flops=3)  # noqa: E501
_op("isnan", POINTWISE, "input", "({input} != {input})")
_op("isinf", POINTWISE, "input", "(fabsf({input}) == SG_INF)")
_op("isposinf", POINTWISE, "input", "({input} == SG_INF)")
_op("isneginf", POINTWISE, "input", "({input} == -SG_INF)")
_op("isfinite", POINTWISE, "input", "(fabsf({input}) < SG_INF)")
_op("signbit", POINTWISE, "input", "(signbit({input}) != 0)")
_op("long", POINTWISE, "input", "(long long)({input})", flops=0, note="float to int64 truncates toward zero, as .long()")  # noqa: E501
_op("threshold", POINTWISE, "input, threshold, value, inplace=False", "({input} > {threshold} ? {input} : {value})")  # noqa: E501
_op("copy", POINTWISE, "input", "{input}", flops=0, note="materialises a view or an alias")
# factories too large to bake as constants (``_capture_lower._bake_factory``): a fill kernel
_op("zeros", POINTWISE, "size", "0", flops=0)
_op("ones", POINTWISE, "size", "1", flops=0)
_op("full", POINTWISE, "size, fill_value", "{fill_value}", flops=0)
_op("new_zeros", POINTWISE, "input, size", "0", flops=0, note="the input gives only dtype and device")  # noqa: E501
_op("new_ones", POINTWISE, "input, size", "1", flops=0, note="the input gives only dtype and device")  # noqa: E501
_op("new_full", POINTWISE, "input, size, fill_value", "{fill_value}", flops=0)
_op("zeros_like", POINTWISE, "input, dtype=None, layout=None, device=None, pin_memory=None, requires_grad=False, memory_format=None", "0", flops=0)  # noqa: E501
_op("ones_like", POINTWISE, "input, dtype=None, layout=None, device=None, pin_memory=None, requires_grad=False, memory_format=None", "1", flops=0)  # noqa: E501
_op("empty_like", POINTWISE, "input, dtype=None, layout=None, device=None, pin_memory=None, requires_grad=False, memory_format=None", "0", flops=0, note="any values will do: zeros")  # noqa: E501
_op("empty", POINTWISE, "size", "0", flops=0, note="any values will do: zeros")
_op("new_empty", POINTWISE, "input, size", "0", flops=0, note="any values will do: zeros")
_op("fill", POINTWISE, "input, value", "{value}", flops=0, note="x.fill_(v): every element v")
_op("full_like", POINTWISE, "input, fill_value, dtype=None, layout=None, device=None, pin_memory=None, requires_grad=False, memory_format=None", "{fill_value}", flops=0)  # noqa: E501
_op("float", POINTWISE, "input", "(float)({input})", flops=0)
_op("int", POINTWISE, "input", "(int)({input})", flops=0, note="float to int32 truncates toward zero, as .int()")  # noqa: E501
_op("bool", POINTWISE, "input", "({input} != 0)", flops=0, note="nonzero (NaN too) is true, as .bool()")  # noqa: E501
# ---- pointwise, binary and ternary -----------------------------------------------------------
_op("add", POINTWISE, "input, other, alpha=1", "({input} + {alpha} * {other})")
_op("sub", POINTWISE, "input, other, alpha=1", "({input} - {alpha} * {other})", aliases=("subtract",))  # noqa: E501
_op("rsub", POINTWISE, "input, other, alpha=1", "({other} - {alpha} * {input})")
_op("mul", POINTWISE, "input, other", "({input} * {other})", aliases=("multiply",))
_op("div", POINTWISE, "input, other, rounding_mode=None", "({input} / {other})", aliases=("true_divide", "divide", "truediv"))  # noqa: E501
_op("div_floor", POINTWISE, "input, other, rounding_mode='floor'", "sg_floordiv({input}, {other})", flops=6, aliases=("floordiv", "floor_divide"))  # noqa: E501
_op("remainder", POINTWISE, "input, other", "({input} - floorf({input} / {other}) * {other})", flops=3, aliases=("mod",))  # noqa: E501
_op("fmod", POINTWISE, "input, other", "fmodf({input}, {other})", flops=3)
_op("maximum", POINTWISE, "input, other", "sg_max({input}, {other})")
_op("minimum", POINTWISE, "input, other", "sg_min({input}, {other})")
_op("fmax", POINTWISE, "input, other", "fmaxf({input}, {other})", note="ignores NaN, as torch.fmax")
_op("fmin", POINTWISE, "input, other", "fminf({input}, {other})", note="ignores NaN, as torch.fmin")
_op("atan2", POINTWISE, "input, other", "atan2f({input}, {other})", flops=8, aliases=("arctan2",))
_op("hypot", POINTWISE, "input, other", "hypotf({input}, {other})", flops=4)
_op("copysign", POINTWISE, "input, other", "copysignf({input}, {other})")
_op("nextafter", POINTWISE, "input, other", "nextafterf({input}, {other})")
_op("logaddexp2", POINTWISE, "input, other", "(({input} == {other} && fabsf({input}) == SG_INF) ? {input} : sg_max({input}, {other}) + log1pf(exp2f(-fabsf({input} - {other}))) * 1.4426950408889634f)", flops=6)  # noqa: E501
_op("logaddexp", POINTWISE, "input, other", "(({input} == {other} && fabsf({input}) == SG_INF) ? {input} : sg_max({input}, {other}) + log1pf(expf(-fabsf({input} - {other}))))", flops=6)  # noqa: E501
_op("xlogy", POINTWISE, "input, other", "({other} != {other} ? {other} : ({input} == 0.f ? 0.f : {input} * logf({other})))", flops=3, aliases=("special_xlogy",))  # noqa: E501
_op("xlog1py", POINTWISE, "input, other", "({other} != {other} ? {other} : ({input} == 0.f ? 0.f : {input} * log1pf({other})))", flops=3, aliases=("special_xlog1py",))  # noqa: E501
_op("heaviside", POINTWISE, "input, values", "({input} == 0.f ? {values} : (float)({input} > 0.f))")  # noqa: E501
_op("logical_and", POINTWISE, "input, other", "((bool)({input}) && (bool)({other}))")
_op("logical_or", POINTWISE, "input, other", "((bool)({input}) || (bool)({other}))")
# bits of integers (``_capture_names`` sends masks to the logical ops): shifts past the width as
# PyTorch's (0 to the left, the sign to the right), computed in 64 bits and stored truncated
_op("bitwise_and", POINTWISE, "input, other", "(({input}) & ({other}))")
_op("bitwise_or", POINTWISE, "input, other", "(({input}) | ({other}))")
_op("bitwise_xor", POINTWISE, "input, other", "(({input}) ^ ({other}))")
_op("bitwise_not", POINTWISE, "input", "(~({input}))")
_op("bitwise_left_shift", POINTWISE, "input, other", "((long long)({other}) < 0 || (long long)({other}) >= 64 ? 0LL : (long long)((unsigned long long)(long long)({input}) << (long long)({other})))")  # noqa: E501
_op("bitwise_right_shift", POINTWISE, "input, other", "((long long)({input}) >> ((long long)({other}) < 0 || (long long)({other}) > 63 ? 63LL : (long long)({other})))")  # noqa: E501
_op("logical_xor", POINTWISE, "input, other", "((bool)({input}) != (bool)({other}))")
_op("isclose", POINTWISE, "input, other, rtol=1e-05, atol=1e-08, equal_nan=False", "({input} == {other} || fabsf({input} - {other}) <= {atol} + {rtol} * fabsf({other}) || ({equal_nan} && {input} != {input} && {other} != {other}))", flops=4)  # noqa: E501
_op("gt", POINTWISE, "input, other", "({input} > {other})", aliases=("greater",))
_op("lt", POINTWISE, "input, other", "({input} < {other})", aliases=("less",))
_op("ge", POINTWISE, "input, other", "({input} >= {other})", aliases=("greater_equal",))
_op("le", POINTWISE, "input, other", "({input} <= {other})", aliases=("less_equal",))
_op("eq", POINTWISE, "input, other", "({input} == {other})")
_op("ne", POINTWISE, "input, other", "({input} != {other})")
_op("where", POINTWISE, "condition, input, other", "({condition} ? {input} : {other})")
_op("masked_fill", POINTWISE, "input, mask, value", "({mask} ? {value} : {input})")
_op("lerp", POINTWISE, "input, end, weight", "({input} + {weight} * ({end} - {input}))", flops=3)  # noqa: E501
_op("addcmul", POINTWISE, "input, tensor1, tensor2, value=1", "({input} + {value} * {tensor1} * {tensor2})", flops=3)  # noqa: E501
_op("addcdiv", POINTWISE, "input, tensor1, tensor2, value=1", "({input} + {value} * {tensor1} / {tensor2})", flops=3)  # noqa: E501
_op("batch_norm_eval", POINTWISE, "input, running_mean, running_var, weight=1.0, bias=0.0, eps=1e-05", "(({input} - {running_mean}) * rsqrtf({running_var} + {eps}) * {weight} + {bias})", flops=5, note="batch norm with running statistics (eval mode)")  # noqa: E501
# ---- elementwise losses (reduction='none'); capture adds the mean/sum -------------------------
_op("mse_elem", POINTWISE, "input, target, reduction='none'", "(({input} - {target}) * ({input} - {target}))", flops=2)  # noqa: E501
_op("l1_elem", POINTWISE, "input, target, reduction='none'", "fabsf({input} - {target})", flops=2)  # noqa: E501
_op("smooth_l1_elem", POINTWISE, "input, target, reduction='none', beta=1.0", "(fabsf({input} - {target}) < {beta} ? 0.5f * ({input} - {target}) * ({input} - {target}) / {beta} : fabsf({input} - {target}) - 0.5f * {beta})", flops=5)  # noqa: E501
_op("huber_elem", POINTWISE, "input, target, reduction='none', delta=1.0", "(fabsf({input} - {target}) < {delta} ? 0.5f * ({input} - {target}) * ({input} - {target}) : {delta} * (fabsf({input} - {target}) - 0.5f * {delta}))", flops=5)  # noqa: E501
_op("soft_margin_elem", POINTWISE, "input, target, reduction='none'", "log1pf(expf(-{target} * {input}))", flops=4)  # noqa: E501
_op("kl_div_elem", POINTWISE, "input, target, reduction='none', log_target=False", "({log_target} ? expf({target}) * ({target} - {input}) : ({target} > 0.f ? {target} * logf({target}) : ({target} == 0.f ? 0.f : SG_NAN)) - {target} * {input})", flops=4, note="xlogy(t, t) - t * x")  # noqa: E501
_op("bce_elem", POINTWISE, "input, target, reduction='none'", "(({target} - 1.f) * sg_max(log1pf(-{input}), -100.f) - {target} * sg_max(logf({input}), -100.f))", flops=6)  # noqa: E501
_op("bce_logits_elem", POINTWISE, "input, target, reduction='none'", "((1.f - {target}) * {input} + sg_softplus(-{input}))", flops=6)  # noqa: E501
# ---- pointwise, reading operands at other positions (_emit_base.py's ``indexed``; they never fuse
# their producers, whose values must be in memory) ----------------------------------------------
_op("cat", POINTWISE, "tensors, dim=0", flops=0, aliases=("concat", "concatenate"))
_op("stack", POINTWISE, "tensors, dim=0", flops=0)
_op("interleave", POINTWISE, "tensors, dim", flops=0, note="the operands' elements in turn along dim: stack(tensors, dim + 1).flatten(dim, dim + 1)")  # noqa: E501
_op("setitem", POINTWISE, "input, index, value", flops=0, note="y[index] = value as a new tensor: the value inside the region, y outside")  # noqa: E501
_op("flip", POINTWISE, "input, dims", flops=0)
_op("gather", POINTWISE, "input, dim, index, sparse_grad=False", flops=0, note="index clamped into range")  # noqa: E501
_op("index", POINTWISE, "input, indices", flops=0, note="x[..., i, ...] with one integer tensor index (indices clamped into range)")  # noqa: E501
_op("index_select", POINTWISE, "input, dim, index", flops=0)
_op("roll", POINTWISE, "input, shifts, dims=None", flops=0)
_op("bucketize", POINTWISE, "input, boundaries, out_int32=False, right=False", flops=8, note="binary search of a 1-D sorted tensor, NaN above every boundary as in PyTorch")  # noqa: E501
_op("pad", POINTWISE, "input, pad, mode='constant', value=None", flops=0, note="constant, reflect, replicate or circular")  # noqa: E501
_op("triu", POINTWISE, "input, diagonal=0", flops=1)
_op("tril", POINTWISE, "input, diagonal=0", flops=1)
# ---- reductions over one dim, a range of dims or everything ----------------------------------
_op("sum", REDUCTION, "input, dim=None, keepdim=False, dtype=None")
_op("mean", REDUCTION, "input, dim=None, keepdim=False, dtype=None")
_op("amax", REDUCTION, "input, dim=None, keepdim=False")
_op("amin", REDUCTION, "input, dim=None, keepdim=False")
_op("max", REDUCTION, "input, dim=None, keepdim=False", note="with dim: values via getitem 0")
_op("min", REDUCTION, "input, dim=None, keepdim=False", note="with dim: values via getitem 0")
_op("prod", REDUCTION, "input, dim=None, keepdim=False, dtype=None")
_op("argmax", REDUCTION, "input, dim=None, keepdim=False")
_op("argmin", REDUCTION, "input, dim=None, keepdim=False")
_op("var", REDUCTION, "input, dim=None, unbiased=True, keepdim=False, correction=None", flops=4)
_op("std", REDUCTION, "input, dim=None, unbiased=True, keepdim=False, correction=None", flops=4)
_op("logsumexp", REDUCTION, "input, dim, keepdim=False", flops=4, aliases=("special_logsumexp",))
_op("norm", REDUCTION, "input, p='fro', dim=None, keepdim=False, dtype=None", flops=2)
_op("linalg_vector_norm", UNSUPPORTED, "input, ord=2, dim=None, keepdim=False, dtype=None", flops=2, note="ord=2 lowers to norm; other orders stay in PyTorch")  # noqa: E501
# ---- row operations: softmax family and normalisations ----------------------------------------
_op("softmax", SOFTMAX, "input, dim=None, _stacklevel=3, dtype=None", flops=5, aliases=("special_softmax",))  # noqa: E501
_op("log_softmax", SOFTMAX, "input, dim=None, _stacklevel=3, dtype=None", flops=5, aliases=("special_log_softmax",))  # noqa: E501
_op("layer_norm", NORM, "input, normalized_shape, weight=None, bias=None, eps=1e-05", flops=8)
_op("rms_norm", NORM, "input, normalized_shape, weight=None, eps=None", flops=6)
_op("group_norm", NORM, "input, num_groups, weight=None, bias=None, eps=1e-05", flops=8)
_op("batch_norm", NORM, "input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-05", flops=8, note="training mode: batch statistics per channel")  # noqa: E501
_op("instance_norm", NORM, "input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True, momentum=0.1, eps=1e-05", flops=8)  # noqa: E501
# ---- library anchors --------------------------------------------------------------------------
_op("linear", GEMM, "input, weight, bias=None", flops=2, note="cuBLAS sgemm, bias in the epilogue kernel")  # noqa: E501
_op("matmul", GEMM, "input, other", flops=2, aliases=("mm", "bmm"))
_op("addmm", GEMM, "input, mat1, mat2, beta=1, alpha=1", flops=2)
_op("conv2d", CONV, "input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1", flops=2, note="cuDNN (fallback: im2col + cuBLAS SGEMM, one per group, or a direct kernel when a GEMM would be tiny or the scratch too large), fused bias and epilogue")  # noqa: E501
_op("conv1d", CONV, "input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1", flops=2, note="cuDNN (fallback: im2col + cuBLAS SGEMM, one per group, or a direct kernel when a GEMM would be tiny or the scratch too large), fused bias and epilogue")  # noqa: E501
_op("conv3d", CONV, "input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1", flops=2, note="cuDNN (fallback: im2col + cuBLAS SGEMM, one per group, or a direct kernel when a GEMM would be tiny or the scratch too large), fused bias and epilogue")  # noqa: E501
for _d in (1, 2, 3):
    _op(f"conv_transpose{_d}d", CONV, "input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1", flops=2, note="cuDNN backward-data (fallback: stride 1 as the flipped-weight conv by im2col + SGEMM; else SGEMM + col2im gather for groups=1; a direct kernel otherwise), fused bias and epilogue")  # noqa: E501
# ---- pooling windows: one thread per output, the window read in a loop -----------------------
for _d in (1, 2, 3):
    _op(f"max_pool{_d}d", POOL, "input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False", flops=1, note="max over each window (NaN propagates)")  # noqa: E501
    _op(f"avg_pool{_d}d", POOL, "input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True" + (", divisor_override=None" if _d > 1 else ""), flops=1)  # noqa: E501
    _op(f"adaptive_avg_pool{_d}d", POOL, "input, output_size", flops=1)
    _op(f"adaptive_max_pool{_d}d", POOL, "input, output_size, return_indices=False", flops=1)
    _op(f"max_pool{_d}d_indices", POOL, "input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False", flops=1, note="max_pool(..., return_indices=True)[1]: where in its plane each window's maximum lies (the first, or the last NaN, as PyTorch's kernel picks)")  # noqa: E501
# ---- scans along one dim: one thread per line, or a warp per line when lines are contiguous ---
_RNN_SIGNATURE = (
    "input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first"
)
_op("lstm", RNN, _RNN_SIGNATURE, flops=8, note="input projection by one cuBLAS SGEMM a layer, then per step an SGEMM of the hidden state and one gate kernel")  # noqa: E501
_op("gru", RNN, _RNN_SIGNATURE, flops=6, note="as lstm, with the GRU's three gates")
_op("rnn_tanh", RNN, _RNN_SIGNATURE, flops=3, note="nn.RNN: as lstm, with tanh of the summed projections")  # noqa: E501
_op("rnn_relu", RNN, _RNN_SIGNATURE, flops=3, note="nn.RNN(nonlinearity='relu')")
_op("cumsum", SCAN, "input, dim, dtype=None", flops=1)
_op("cumprod", SCAN, "input, dim, dtype=None", flops=1)
_op("logcumsumexp", SCAN, "input, dim", flops=4)
_op("cummax_values", SCAN, "input, dim", flops=1, note="cummax(...)[0]: the running maximum")
_op("cummin_values", SCAN, "input, dim", flops=1, note="cummin(...)[0]: the running minimum")
_op("sort_values", SCAN, "input, dim=-1, descending=False", flops=20, note="sort(...)[0]: a block per line, bitonic in shared memory; topk, kthvalue, median and quantile read it")  # noqa: E501
_op("sort_indices", SCAN, "input, dim=-1, descending=False", flops=20, note="sort(...)[1], argsort: the bitonic sort of positions riding in each key's low bits (ties keep their order)")  # noqa: E501
_op("topk_values", SCAN, "input, k, dim=-1, largest=True", flops=10, note="topk(...)[0] of lines too long to sort in a block: radix select of the k-th key, the k sorted in shared memory")  # noqa: E501
_op("topk_indices", SCAN, "input, k, dim=-1, largest=True", flops=10, note="topk(...)[1] the same way, positions riding in the keys' low bits (ties to the first position)")  # noqa: E501
_op("cummax_indices", SCAN, "input, dim", flops=2, note="cummax(...)[1]: where the running maximum is (the later on a tie)")  # noqa: E501
_op("cummin_indices", SCAN, "input, dim", flops=2, note="cummin(...)[1]: where the running minimum is (the later on a tie)")  # noqa: E501
_op("cummax", UNSUPPORTED, "input, dim", note="the pair itself; each element is cummax_values or cummax_indices")  # noqa: E501
_op("cummin", UNSUPPORTED, "input, dim", note="the pair itself; each element is cummin_values or cummin_indices")  # noqa: E501
# ---- scatters: the input copied, then a thread per source element writes where its index says
_op("scatter_add", SCATTER, "input, dim, index, src", flops=1, note="atomicAdd into a copy of the input")  # noqa: E501
_op("index_add", SCATTER, "input, dim, index, source, alpha=1", flops=1, note="atomicAdd into a copy of the input")  # noqa: E501
_op("scatter_reduce", SCATTER, "input, dim, index, src, reduce, include_self=True", flops=1, note="sum, amax or amin into a copy of the input (include_self): atomicAdd or a compare-and-swap loop")  # noqa: E501
_op("scatter", SCATTER, "input, dim, index, src=None, value=None, reduce=None", flops=0, note="stores into a copy of the input (float32 or bool); where indices repeat with unequal values the winner is unspecified, as in PyTorch")  # noqa: E501
# ---- views: host-side, no kernel --------------------------------------------------------------
_op("view", VIEW, "input, *shape", flops=0, aliases=("reshape",))
_op("flatten", VIEW, "input, start_dim=0, end_dim=-1", flops=0)
_op("unflatten", VIEW, "input, dim, sizes", flops=0)
_op("unsqueeze", VIEW, "input, dim", flops=0)
_op("squeeze", VIEW, "input, dim=None", flops=0)
_op("permute", VIEW, "input, *dims", flops=0)
_op("transpose", VIEW, "input, dim0, dim1", flops=0, aliases=("swapaxes",))
_op("t", VIEW, "input", flops=0)
_op("expand", VIEW, "input, *sizes", flops=0)
_op("expand_as", VIEW, "input, other", flops=0)
_op("view_as", VIEW, "input, other", flops=0, aliases=("reshape_as",))
_op("getitem", VIEW, "input, index", flops=0, note="basic slicing only")
_op("narrow", VIEW, "input, dim, start, length", flops=0)
_op("select", VIEW, "input, dim, index", flops=0)
_op("view_as_complex", VIEW, "input", flops=0, note="a complex64 view of (real, imaginary) float pairs; products and sums of it are lowered to the pairs")  # noqa: E501
_op("view_as_real", VIEW, "input", flops=0)
_op("unbind", VIEW, "input, dim=0", flops=0)
_op("diagonal", VIEW, "input, offset=0, dim1=0, dim2=1", flops=0)
_op("unfold", VIEW, "input, dimension, size, step", flops=0, note="Tensor.unfold: overlapping windows as a strided view")  # noqa: E501
_op("chunk", VIEW, "input, chunks, dim=0", flops=0)
_op("split", VIEW, "input, split_size_or_sections, dim=0", flops=0, aliases=("split_with_sizes",))
# ---- identities: no work at all ---------------------------------------------------------------
_op("contiguous", IDENTITY, "input, memory_format=None", flops=0, note="a copy when the input is a strided view")  # noqa: E501
_op("clone", IDENTITY, "input, memory_format=None", flops=0)
_op("detach", IDENTITY, "input", flops=0)
_op("dropout", IDENTITY, "input, p=0.5, training=False, inplace=False", flops=0, note="identity when p == 0 or not training")  # noqa: E501
for _name in ("dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"):
    _op(_name, IDENTITY, "input, p=0.5, training=False, inplace=False", flops=0, note="identity when p == 0 or not training")  # noqa: E501
_op("identity", IDENTITY, "input", flops=0)
# ---- explicitly unsupported: they stay in PyTorch, declared ------------------------------------
_op("fft_fft", UNSUPPORTED, "input, n=None, dim=-1, norm=None", note="FFTs need cuFFT; no rule emits them")  # noqa: E501
_op("fft_rfft", UNSUPPORTED, "input, n=None, dim=-1, norm=None", note="FFTs need cuFFT; no rule emits them")  # noqa: E501
_op("rrelu", UNSUPPORTED, "input, lower=0.125, upper=0.3333333333333333, training=False, inplace=False", note="outside training a leaky_relu of the mean slope; in training the slopes are drawn")  # noqa: E501
_op("sort", UNSUPPORTED, "input, dim=-1, descending=False", note="generated as sort_values and sort_indices; lines longer than 8192 elements (4096 with indices) stay in PyTorch")  # noqa: E501
_op("topk", UNSUPPORTED, "input, k, dim=-1, largest=True, sorted=True", note="generated from sort_values and sort_indices, or topk_values and topk_indices for longer lines (sorted=True only)")  # noqa: E501
_op("scaled_dot_product_attention", UNSUPPORTED, "query, key, value", note="attention is not generated yet")  # noqa: E501
# fmt: on


def lookup(op: str) -> OpInfo | None:
    """The registry entry of ``op``, or ``None`` when the op is unknown."""
    return REGISTRY.get(op)


def explain_unsupported(op: str) -> str:
    """Say why ``op`` stays in PyTorch (empty string when the registry supports it).

    Args:
        op: Canonical op name.

    Returns:
        A sentence starting with ``unsupported: <op>``, or ``""`` for a supported op.
    """
    info = REGISTRY.get(op)
    if info is None:
        return f"unsupported: {op} (not in the op registry; add one _op(...) line to ops.py)"
    if info.kind == UNSUPPORTED:
        return f"unsupported: {op} ({info.note or 'no rule emits it'})"
    return ""
