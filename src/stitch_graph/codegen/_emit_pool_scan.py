"""Pooling (max, average, adaptive) and scans (cumsum, cumprod, logcumsumexp, the values of
cummax and cummin): ops whose output element reads a run of its input, a window or a prefix of
a line.

Pooling is a pointwise kernel whose anchor value loops over the window, or, over rows of a warp
of outputs or more, a kernel that stages each window row's input span in shared memory, a block
per run of outputs (the tuner times both). Scans use a thread per line or a warp per line
(shuffle scan plus carry). ``_PoolScanEmitter`` is a mixin of ``emit._Emitter``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from stitch_graph.codegen._emit_base import _CTYPE, _MAX_GRID, _Args, _line_layout, _literal
from stitch_graph.codegen._emit_sort import _SortEmitter
from stitch_graph.codegen.ir import Group, Ref, contiguous_strides, numel
from stitch_graph.codegen.schedule import pool_dims
from stitch_graph.codegen.tuning import KernelTuning

# Staged pooling keeps a block's span of one input row in shared memory; past this many floats
# (32 KiB) the tile would cost occupancy, and the block takes fewer outputs.
_STAGE_FLOATS = 8192


def _scan_chunks(lines: int, length: int, split: bool | None) -> int:
    """Chunks a line of a thread-per-line scan is cut into: 1 (one thread a line) where the
    lines alone fill the GPU or are short; up to 16 where a few long lines would each be one
    thread's serial walk (1552 lines of 513: 12 threads an SM of an H100). ``split`` forces
    either form."""
    if split is False or length < 64:
        return 1
    if split is None and lines > 32768:
        return 1
    return max(2, min(16, length // 32))


@dataclass(frozen=True)
class _Window:
    """One pooling op's windows: sizes, strides, padding and dilation per spatial dim, and the
    CUDA lines that walk a window and turn its accumulator into the pooled value."""

    op: str
    args: dict[str, Any]
    isp: tuple[int, ...]  # input spatial dims
    osp: tuple[int, ...]  # output spatial dims
    ks: tuple[int, ...] = ()
    st: tuple[int, ...] = ()
    pad: tuple[int, ...] = ()
    dil: tuple[int, ...] = ()

    @classmethod
    def of(cls, node: Any, isp: tuple[int, ...], osp: tuple[int, ...]) -> _Window:
        nd = len(isp)

        def per_dim(key: str, default: Any) -> tuple[int, ...]:
            value = node.args.get(key)
            if value is None or (isinstance(value, list | tuple) and not value):
                value = default
            values = [int(v) for v in value] if isinstance(value, list | tuple) else [int(value)]
            return tuple(values * nd if len(values) == 1 else values)

        if node.op.startswith("adaptive"):
            return cls(node.op, dict(node.args), isp, osp)
        ks = per_dim("kernel_size", 1)
        is_max = "max" in node.op
        return cls(
            node.op, dict(node.args), isp, osp, ks, per_dim("stride", list(ks)),
            per_dim("padding", 0), per_dim("dilation", 1) if is_max else (1,) * nd,
        )

    @property
    def adaptive(self) -> bool:
        return self.op.startswith("adaptive")

    @property
    def is_max(self) -> bool:
        return "max" in self.op

    @property
    def init(self) -> str:
        return "-SG_INF" if self.is_max else "0.f"

    @property
    def update(self) -> str:
        """Fold window element ``v`` into ``acc`` (max keeps a NaN, as PyTorch does)."""
        return "acc = (v > acc || v != v) ? v : acc;" if self.is_max else "acc += v;"

    def inside(self, j: int) -> bool:
        """Whether every window of dim ``j`` lies in the input (no padding reached)."""
        if self.adaptive:
            return False
        last = (self.osp[j] - 1) * self.st[j] - self.pad[j] + (self.ks[j] - 1) * self.dil[j]
        return self.pad[j] == 0 and last < self.isp[j]

    def clipped(self, j: int) -> list[str]:
        """``s{j}``/``e{j}``: dim ``j``'s window around ``o{j}`` clipped to the padded input,
        then to the input; ``n{j}`` its padded size (the divisor when padding counts)."""
        return [
            f"int s{j} = o{j} * {self.st[j]} - {self.pad[j]};",
            f"int e{j} = min(s{j} + {self.ks[j]}, {self.isp[j] + self.pad[j]});",
            f"const int n{j} = e{j} - s{j};",
            f"s{j} = max(s{j}, 0);",
            f"e{j} = min(e{j}, {self.isp[j]});",
        ]

    def dim(self, j: int) -> tuple[list[str], list[str], str, str]:
        """Dim ``j``'s window around output coordinate ``o{j}``: lines before its loop, the
        loop's header lines (binding ``c{j}``), its element count and its divisor size."""
        i_j = self.isp[j]
        if self.adaptive:
            o_j = self.osp[j]
            lines = [
                f"const int s{j} = (int)(((long long)o{j} * {i_j}) / {o_j});",
                f"const int e{j} = (int)(((long long)(o{j} + 1) * {i_j} + {o_j - 1}) / {o_j});",
            ]
            return lines, [f"for (int c{j} = s{j}; c{j} < e{j}; ++c{j}) {{"], f"(e{j} - s{j})", ""
        last = j == len(self.isp) - 1
        unroll = ["#pragma unroll"] if last else []
        k, st, pad, dil = self.ks[j], self.st[j], self.pad[j], self.dil[j]
        if self.is_max or self.inside(j):
            # a window that never leaves the input needs no bounds: a fixed trip count,
            # unrolled innermost, so a thread has its window's loads in flight at once
            loops = [
                *unroll,
                f"for (int w{j} = 0; w{j} < {k}; ++w{j}) {{",
                f"const int c{j} = o{j} * {st} - {pad} + w{j} * {dil};",
                *([] if self.inside(j) else [f"if (c{j} < 0 || c{j} >= {i_j}) continue;"]),
            ]
            return [], loops, str(k), str(k)
        # the window's fixed count, unrolled innermost, the clipped part skipped
        loops = [
            *unroll,
            f"for (int w{j} = 0; w{j} < {k}; ++w{j}) {{",
            f"const int c{j} = o{j} * {st} - {pad} + w{j};",
            f"if (c{j} < s{j} || c{j} >= e{j}) continue;",
        ]
        return self.clipped(j), loops, f"(e{j} - s{j})", f"n{j}"

    def dims(self, upto: int) -> tuple[list[str], list[str], list[str], list[str]]:
        """``dim`` for the first ``upto`` dims together: their lines, loop headers, counts and
        sizes."""
        lines: list[str] = []
        loops: list[str] = []
        count: list[str] = []
        size: list[str] = []
        for j in range(upto):
            before, header, n_j, size_j = self.dim(j)
            lines += before
            loops += header
            count.append(n_j)
            size.append(size_j)
        return lines, loops, count, size

    def pooled(self, count: list[str], size: list[str]) -> str:
        """The pooled value from ``acc``: max as is, average over PyTorch's divisor."""
        if self.is_max:
            return "acc"
        divisor = self.args.get("divisor_override")
        if divisor:
            div = _literal(float(divisor))
        elif self.adaptive or not self.args.get("count_include_pad", True):
            div = f"(float)({' * '.join(count)})"
        else:
            div = f"(float)({' * '.join(size)})"
        return f"acc / {div}"

    def slides(self, ir: Any, x: Ref) -> bool:
        """Whether windows slide by one along the last dim over a contiguous input whose rows
        are whole float4s: four neighbouring outputs then share all but four of their
        elements, and a thread loads their span once, as float4s (``_pool_sliding``)."""
        if self.adaptive or self.st[-1] != 1 or self.isp[-1] % 4 or self.osp[-1] < 4:
            return False
        counts_padding = self.args.get("count_include_pad", True)
        if not self.is_max and (self.args.get("divisor_override") or not counts_padding):
            return False
        return tuple(ir.strides[x]) == contiguous_strides(tuple(ir.shapes[x]))

    def staged_outputs(self, block: int) -> int:
        """Outputs of one row a staged block computes (0: not worth staging).

        Staging can pay only where a warp's window loads would fetch the same lines many times:
        windows wider than one element along the last dim, and rows long enough to give a block
        a warp of outputs or more."""
        if self.adaptive or self.ks[-1] < 2 or self.osp[-1] < 32:
            return 0
        span = (self.ks[-1] - 1) * self.dil[-1] + 1
        fit = (_STAGE_FLOATS - span) // self.st[-1] + 1
        outputs = min(block, 32 * math.ceil(self.osp[-1] / 32), fit // 32 * 32)
        return outputs if outputs >= 32 else 0


def _nest(loops: list[str], body: list[str]) -> tuple[list[str], int]:
    """Loop headers indented one step each around ``body``; the number of braces opened."""
    nested: list[str] = []
    depth = 0
    for line in loops:
        nested.append("  " * depth + line)
        depth += line.endswith("{")
    return nested + ["  " * depth + line for line in body], depth


def _coords(idx: str, dims: tuple[int, ...], plane: int, it: str) -> list[str]:
    """``base`` (the input offset of the plane, ``plane`` elements each) and ``o{j}`` of the
    linear index ``idx`` over the output dims ``dims``."""
    lines = [f"const {it} base = ({it})({idx} / {numel(dims)}) * {plane};"]
    for j in range(len(dims)):
        inner = numel(dims[j + 1 :])
        coord = f"({idx} / {inner})" if inner > 1 else idx
        lines.append(f"const int o{j} = (int)({coord} % {dims[j]});")
    return lines


def _in_offset(isp: tuple[int, ...]) -> str:
    """Offset inside a plane of the element at input coordinates ``c0..``."""
    offset = "c0"
    for j in range(1, len(isp)):
        offset = f"({offset}) * {isp[j]} + c{j}"
    return offset


# scan op -> (identity, how two running values combine)
_SCANS = {
    "cumsum": ("0.f", "({a} + {b})"),
    "cumprod": ("1.f", "({a} * {b})"),
    "logcumsumexp": ("-SG_INF", "sg_logaddexp({a}, {b})"),
    "cummax_values": ("-SG_INF", "sg_max({a}, {b})"),  # a NaN, once seen, stays
    "cummin_values": ("SG_INF", "sg_min({a}, {b})"),
}
# cummax/cummin's indices: the running extreme and where it is; the later of two wins on a tie
# and where it is NaN, and a NaN, once seen, stays (PyTorch's order)
_INDEXED_SCANS = {"cummax_indices": ("-SG_INF", ">="), "cummin_indices": ("SG_INF", "<=")}


def _later_wins(op: str, later: str, earlier: str) -> str:
    """Whether the later of two running extremes (values ``later``, ``earlier``) is kept."""
    cmp = _INDEXED_SCANS[op][1]
    return f"({later} != {later} || ({earlier} == {earlier} && {later} {cmp} {earlier}))"


def _thread_per_line(
    comment: str, kernel: str, spelled: tuple[str, int, Any, str],
    layout: tuple[int, int, int, str], state: list[str], step: list[str],
) -> list[str]:
    """A scan kernel with a thread a line: ``state`` declared at the line's start, ``step``
    run at each element ``k`` (offset ``i``) in order."""
    index, block, args, otype = spelled
    length, inner, lines_n, base = layout
    return [
        comment,
        f'extern "C" __global__ __launch_bounds__({block}) void {kernel}('
        f"{args.signature([f'{otype}* __restrict__ out'])}) {{",
        f"  for ({index} r = ({index})blockIdx.x * {block} + threadIdx.x; r < {lines_n}; "
        f"r += ({index})gridDim.x * {block}) {{",
        f"    const {index} b = {base};",
        *(f"    {line}" for line in state),
        f"    for ({index} k = 0; k < {length}; ++k) {{",
        f"      const {index} i = b + k * {inner};",
        *(f"      {line}" for line in step),
        "    }",
        "  }",
        "}",
    ]


class _PoolScanEmitter(_SortEmitter):
    """Pooling (``pool``) and scan (``scan``) kernels; sorts are scans of their own."""

    # ---- pooling -------------------------------------------------------------------------------
    def pool(self, g: Group, kernel: str, tun: KernelTuning) -> list[str]:
        """Max/average pooling (fixed or adaptive windows) over the last 1-3 dims.

        Fixed windows over rows of a warp's outputs or more are staged (``_pool_staged``) where
        ``tun.stage_window`` says so, by default over inputs of 2**31 elements or more only (on
        the H200 the thread-per-output kernel was 1.3-2x faster on the four smaller KernelBench
        L1 pooling rows where both were timed; on L1's 17 GB average pooling staging took 4.8 ms
        where it took 15.5). Otherwise a grid-stride pointwise kernel over the output
        whose anchor value loops over the window: one thread per output, the pointwise prologue
        evaluated on each window element and the epilogue on the pooled value. Window bounds
        follow PyTorch: padding is skipped (max) or counted as ``count_include_pad`` says
        (average, divisor from the window clipped to the padded input); adaptive windows are
        ``[floor(o*I/O), ceil((o+1)*I/O))``.
        """
        ir = self.ir
        node = ir.node(g.anchor or "")
        nd = pool_dims(node)
        x: Ref = node.args["input"]
        xs, os_ = ir.shapes[x], tuple(node.shape)
        win = _Window.of(node, tuple(xs[-nd:]), os_[-nd:])
        it = "long long" if numel(xs) >= 2**31 else "int"
        indices = node.op.endswith("_indices")  # where each maximum lies: a thread an output
        outputs = 0 if indices else win.staged_outputs(min(tun.block_size, 1024))
        staged = tun.stage_window if tun.stage_window is not None else numel(xs) >= 2**31
        if outputs and staged:
            return self._pool_staged(g, kernel, win, outputs)
        if tun.vector_width == 4 and win.slides(ir, x) and not g.prologue and not indices:
            return self._pool_sliding(g, kernel, win, tun)

        def anchor_line(args: _Args, idx: str) -> tuple[str, str]:
            loads = _Args(ir, refs=args.refs)  # window elements: scalar loads, never float4
            env: dict[str, str] = {}
            pre = self.exprs(g.prologue, xs, "ii", env, loads)
            value = self.value_of(x, xs, "ii", env, loads)
            windows, loops, count, size = win.dims(nd)
            lines = [*_coords(idx, win.osp, numel(win.isp), it), *windows]
            update, at = win.update, []
            if indices:  # the first element taken, then each larger one or NaN, as PyTorch's
                # kernel takes them from the window's first element and -inf
                update = "if (arg < 0 || v > acc || v != v) { acc = v; arg = at; }"
                at = [f"const {it} at = {_in_offset(win.isp)};"]
            body = [
                *at,
                f"const {it} ii = base + {'at' if indices else _in_offset(win.isp)};",
                *pre,
                f"const float v = {value};",
                update,
            ]
            nested, depth = _nest(loops, body)
            code = [
                f"{'long long' if indices else 'float'} v_{node.name};",
                "{",
                *(f"  {line}" for line in lines),
                f"  float acc = {win.init};",
                *(["  long long arg = -1;"] if indices else []),
                *(f"  {line}" for line in nested),
                "  " + "}" * depth,
                f"  v_{node.name} = {'arg' if indices else win.pooled(count, size)};",
                "}",
            ]
            return node.name, "\n    ".join(code)

        out = ir.node(g.output)
        # one output a thread: a window's loads are scalar, and four outputs a thread spread a
        # warp's loads four times wider (KernelBench L1 1-D average pooling, H200: 2.32 ms with
        # four, 1.96 ms with one)
        scalar = tun.model_copy(update={"vector_width": 1})
        return self.pointwise(g.id, kernel, g.epilogue, out, scalar, anchor_line)

    def _pool_staged(self, g: Group, kernel: str, win: _Window, outputs: int) -> list[str]:
        """Pooling with a block per ``outputs`` consecutive outputs of one output row.

        For each window row (the outer window dims, uniform across the block) the block loads
        the input span its windows cover into shared memory, coalesced and with the prologue
        applied once per element, then each thread folds its window from there. A thread per
        output reading its window straight from memory sends a warp's loads to lines
        ``stride`` floats apart, and overlapping windows fetch each line once per window
        element: on KernelBench L1's 11x11 average pooling over 17 GB that took 15.5 ms where
        eager's kernel takes 4.1 ms and this one 4.8 ms (H200)."""
        ir = self.ir
        node = ir.node(g.anchor or "")
        x: Ref = node.args["input"]
        xs = ir.shapes[x]
        out = ir.node(g.output)
        nd = len(win.isp)
        last = nd - 1
        k, st, pad, dil = win.ks[last], win.st[last], win.pad[last], win.dil[last]
        width = (outputs - 1) * st + (k - 1) * dil + 1
        o_last, i_last = win.osp[last], win.isp[last]
        tiles = math.ceil(o_last / outputs)
        rows = numel(out.shape) // o_last
        big = numel(xs) >= 2**31 or numel(out.shape) >= 2**31
        it = "long long" if big else "int"
        args = _Args(ir)
        env_in: dict[str, str] = {}  # the prologue's values, at input element ii
        pre = self.exprs(g.prologue, xs, "ii", env_in, args)
        value = self.value_of(x, xs, "ii", env_in, args)
        head = [
            f"const {it} row = ({it})blockIdx.x / {tiles};",
            f"const int t0 = (int)(blockIdx.x % {tiles}) * {outputs};",
            f"const int o{last} = t0 + threadIdx.x;",
            *_coords("row", win.osp[:last], numel(win.isp), it),
        ]
        windows, loops, count, size = win.dims(last)  # the outer dims: uniform over the block
        # the last dim's count and divisor as the thread-per-output kernel has them; its loop
        # runs over the staged tile instead
        before, _loop, n_last, size_last = win.dim(last)
        head += [*windows, *before]
        count.append(n_last)
        size.append(size_last)
        stage = [
            f"for (int s = threadIdx.x; s < {width}; s += {outputs}) {{",
            f"  const int c{last} = t0 * {st} - {pad} + s;",
            f"  float v = {win.init};  // padding: the fold's identity",
            f"  if (c{last} >= 0 && c{last} < {i_last}) {{",
            f"    const {it} ii = base + {_in_offset(win.isp)};",
            *(f"    {line}" for line in pre),
            f"    v = {value};",
            "  }",
            "  tile[s] = v;",
            "}",
            "__syncthreads();",
            f"if (o{last} < {o_last}) {{",
            "  #pragma unroll",
            f"  for (int w = 0; w < {k}; ++w) {{",
            f"    const float v = tile[threadIdx.x * {st} + w * {dil}];",
            f"    {win.update}",
            "  }",
            "}",
            "__syncthreads();",
        ]
        nested, depth = _nest(loops, stage)
        env = {node.name: f"v_{node.name}"}
        post = self.exprs(g.epilogue, tuple(out.shape), "i", env, args)
        otype = _CTYPE.get(out.dtype, "float")
        src = [
            f"// {node.op}: a block per {outputs} outputs of a row, each window row's input "
            f"span ({width} floats) staged in shared memory",
            f'extern "C" __global__ __launch_bounds__({outputs}) void {kernel}('
            f"{args.signature([f'{otype}* __restrict__ out'])}) {{",
            f"  __shared__ float tile[{width}];",
            *(f"  {line}" for line in head),
            f"  float acc = {win.init};",
            *(f"  {line}" for line in nested),
            *(["  " + "}" * depth] if depth else []),
            f"  if (o{last} >= {o_last}) return;",
            f"  const {it} i = row * {o_last} + o{last};",
            f"  const float v_{node.name} = {win.pooled(count, size)};",
            *(f"  {line}" for line in post),
            f"  out[i] = {env[out.name]};",
            "}",
        ]
        return self._add_kernel(src, kernel, rows * tiles, outputs, args, out)

    def _pool_sliding(self, g: Group, kernel: str, win: _Window, tun: KernelTuning) -> list[str]:
        """Pooling whose windows slide by one along the last dim: a thread per four
        neighbouring outputs of a row loads the span their windows cover once, as float4s
        (scalar loads at the row's ends and where the input is not 16-byte aligned), and folds
        each window from registers. A thread per output issues a scalar load per window
        element, most of them of lines its neighbours fetch too (KernelBench L1's 1-D max and
        average pooling, windows of 8 over rows of 65536, were 0.82x and 0.83x of
        ``torch.compile`` on an H200)."""
        ir = self.ir
        node = ir.node(g.anchor or "")
        x: Ref = node.args["input"]
        out = ir.node(g.output)
        last = len(win.isp) - 1
        k, pad, dil = win.ks[last], win.pad[last], win.dil[last]
        length, o_last = win.isp[last], win.osp[last]
        shift = (-pad) % 4  # where the first window starts in the first float4 loaded
        units = (shift + 3 + (k - 1) * dil) // 4 + 1
        quads = math.ceil(o_last / 4)
        rows = numel(out.shape) // o_last
        total = rows * quads
        big = max(numel(ir.shapes[x]), numel(out.shape), total) >= 2**31
        it = "long long" if big else "int"
        args = _Args(ir)
        a = args.param(x)
        windows, loops, count, size = win.dims(last)  # the outer dims, as the scalar kernel
        row_offset = " + ".join(
            f"c{j} * {numel(win.isp[j + 1:])}" for j in range(last)
        ) or "0"
        body = [
            f"const {it} at = base + ({it})({row_offset});",
            f"float r[{4 * units}];",
            "#pragma unroll",
            f"for (int u = 0; u < {units}; ++u) {{",
            "  const int c = u0 + 4 * u;",
            f"  if (vec && c >= 0 && c + 3 < {length}) {{",
            f"    const float4 f = *reinterpret_cast<const float4*>({a} + at + c);",
            "    r[4 * u] = f.x; r[4 * u + 1] = f.y; r[4 * u + 2] = f.z; r[4 * u + 3] = f.w;",
            "  } else {",
            "    #pragma unroll",
            "    for (int l = 0; l < 4; ++l)",  # padding reads as the fold's identity
            f"      r[4 * u + l] = (c + l >= 0 && c + l < {length}) ? {a}[at + c + l] : {win.init};",
            "  }",
            "}",
            "#pragma unroll",
            "for (int q = 0; q < 4; ++q) {",
            "  #pragma unroll",
            f"  for (int w = 0; w < {k}; ++w) {{",
            f"    const float v = r[{shift} + q + w * {dil}];",
            "    " + win.update.replace("acc", "accs[q]"),
            "  }",
            "}",
        ]
        nested, depth = _nest(loops, body)
        before, _loop, n_last, size_last = win.dim(last)
        env = {node.name: f"v_{node.name}"}
        post = self.exprs(g.epilogue, tuple(out.shape), "i", env, args)
        otype = _CTYPE.get(out.dtype, "float")
        # 1-D windows stage a warp's results for coalesced stores (L1 44 1.35x faster); over
        # 2-D windows the loads dominate and staging cost L1 42 14% (H100, h100-2026-12-07h)
        staged = last == 0
        store = [
            f"if (o{last} >= {o_last}) break;",
            f"const {it} i = row * {o_last} + o{last};",
            *before,
            "const float acc = accs[q];",
            f"const float v_{node.name} = {win.pooled([*count, n_last], [*size, size_last])};",
            *post,
            f"st[lane * 4 + q] = {env[out.name]};" if staged else f"out[i] = {env[out.name]};",
        ]
        folded = [  # the thread's four outputs (staged over 1-D windows)
            f"const {it} row = t / {quads};",
            f"const int o = (int)(t % {quads}) * 4;",
            f"const int u0 = o - {pad + shift};",
            *_coords("row", win.osp[:last], numel(win.isp), it),
            *windows,
            f"float accs[4] = {{{', '.join([win.init] * 4)}}};",
            *nested,
            *(["}" * depth] if depth else []),
            "#pragma unroll",
            "for (int q = 0; q < 4; ++q) {",
            f"  const int o{last} = o + q;",
            *(f"  {line}" for line in store),
            "}",
        ]
        block = min(tun.block_size, 1024)
        comment = (f"// {node.op}: windows sliding by one; a thread per four outputs of a row, "
                   f"their span ({4 * units} floats) loaded once as float4s")
        vec = f"  const bool vec = (reinterpret_cast<unsigned long long>({a}) & 15) == 0;"
        if not staged:
            src = [
                comment,
                f'extern "C" __global__ __launch_bounds__({block}) void {kernel}('
                f"{args.signature([f'{otype}* __restrict__ out'])}) {{",
                vec,
                f"  for ({it} t = ({it})blockIdx.x * {block} + threadIdx.x; t < {total}; "
                f"t += ({it})gridDim.x * {block}) {{",
                *(f"    {line}" for line in folded),
                "  }",
                "}",
            ]
            grid = max(1, min(math.ceil(total / block), _MAX_GRID))
            return self._add_kernel(src, kernel, grid, block, args, out)
        src = [
            f"{comment}; a warp's 128 results staged in shared memory and stored by consecutive "
            "lanes",
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}('
            f"{args.signature([f'{otype}* __restrict__ out'])}) {{",
            f"  __shared__ {otype} staged[{block * 4}];",
            "  const int lane = threadIdx.x & 31;",
            f"  {otype}* const st = staged + (threadIdx.x - lane) * 4;",
            vec,
            f"  for ({it} tw = ({it})blockIdx.x * {block} + (threadIdx.x - lane); tw < {total}; "
            f"tw += ({it})gridDim.x * {block}) {{",  # a warp's lanes stay in step for __syncwarp
            f"    const {it} t = tw + lane;",
            f"    if (t < {total}) {{",
            *(f"      {line}" for line in folded),
            "    }",
            "    __syncwarp();",
            "    #pragma unroll",
            "    for (int s = 0; s < 4; ++s) {",
            f"      const {it} ts = tw + (s * 32 + lane) / 4;",
            f"      const int os = (int)(ts % {quads}) * 4 + lane % 4;",
            f"      if (ts >= {total} || os >= {o_last}) continue;",
            f"      const {it} i = ts / {quads} * {o_last} + os;",
            "      out[i] = st[s * 32 + lane];",
            "    }",
            "    __syncwarp();",
            "  }",
            "}",
        ]
        grid = max(1, min(math.ceil(total / block), _MAX_GRID))
        return self._add_kernel(src, kernel, grid, block, args, out)

    # ---- scans ---------------------------------------------------------------------------------
    def _chunked_scan(
        self, node: Any, kernel: str, layout: tuple[int, int, int, str], chunks: int,
        pre: list[str], post: list[str], spelled: tuple[str, str, str, str, str],
        args: Any, out: Any,
    ) -> list[str]:
        """A thread per (line, chunk): 32 neighbouring lines a block, each cut into
        ``chunks`` chunks. Every thread combines its chunk, the chunk totals before it come
        from shared memory, and a second pass over the chunk stores the running values."""
        length, inner, lines_n, base = layout
        value, result, index, run_t, otype = spelled
        ident, combine = _SCANS[node.op]
        span = math.ceil(length / chunks)
        block = 32 * chunks

        def walk(body: list[str]) -> list[str]:
            return [
                f"      for ({index} k = k0; k < k1; ++k) {{",
                f"        const {index} i = b + k * {inner};",
                *(f"        {line}" for line in pre),
                f"        run = {combine.format(a='run', b=value)};",
                *(f"        {line}" for line in body),
                "      }",
            ]

        src = [
            f"// {node.op} along {length} element(s) of {lines_n} line(s), {chunks} chunks a "
            "line: a thread per chunk, the chunks' totals combined in shared memory",
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}('
            f"{args.signature([f'{otype}* __restrict__ out'])}) {{",
            f"  __shared__ {run_t} part[{chunks}][32];",
            "  const int lane = threadIdx.x & 31, c = threadIdx.x >> 5;",
            f"  const {index} k0 = ({index})c * {span}, k1 = k0 + {span} < {length} ? "
            f"k0 + {span} : {length};",
            f"  for ({index} g = ({index})blockIdx.x * 32; g < {lines_n}; "
            f"g += ({index})gridDim.x * 32) {{",
            f"    const {index} r = g + lane;",
            f"    const {index} b = {base};",
            f"    {run_t} run = {ident};",
            f"    if (r < {lines_n}) {{",
            *walk([]),
            "    }",
            "    part[c][lane] = run;",
            "    __syncthreads();",
            f"    run = {ident};",
            "    for (int q = 0; q < c; ++q) "
            f"run = {combine.format(a='run', b='part[q][lane]')};",
            "    __syncthreads();  // the totals are rewritten by the next group of lines",
            f"    if (r < {lines_n}) {{",
            *walk([f"const {run_t} v_{node.name} = run;", *post, f"out[i] = {result};"]),
            "    }",
            "  }",
            "}",
        ]
        grid = max(1, min(math.ceil(lines_n / 32), _MAX_GRID))
        return self._add_kernel(src, kernel, grid, block, args, out)

    def scan(self, g: Group, kernel: str, tun: KernelTuning) -> list[str]:
        """Inclusive cumulative sum/product along one dim, prologue on load, epilogue on store.

        Lines whose elements are ``inner`` apart with ``inner >= 32`` (a non-last dim): one thread
        per line, neighbouring threads on neighbouring lines (coalesced). Contiguous lines: one
        warp per line, 32 elements at a time with a ``__shfl_up_sync`` scan and a carry
        (``tun.rows_per_block == 1`` forces the thread-per-line kernel).
        """
        ir = self.ir
        node = ir.node(g.anchor or "")
        if node.op in ("sort_values", "sort_indices"):
            return self.sort_lines(g, kernel, tun)
        if node.op in ("topk_values", "topk_indices"):
            return self.top_lines(g, kernel, tun)
        x: Ref = node.args["input"]
        xs = ir.shapes[x]
        dim = int(node.args["dim"]) % max(len(xs), 1)
        length, inner, lines_n, base = _line_layout(xs, dim)
        out = ir.node(g.output)
        big = numel(xs) >= 2**31
        index = "long long" if big else "int"
        run_t = _CTYPE.get(node.dtype, "float")  # an int64 sum of ints or bools counts exactly
        args = _Args(ir)
        env: dict[str, str] = {}
        pre = self.exprs(g.prologue, xs, "i", env, args)
        value = self.value_of(x, xs, "i", env, args)
        env2 = dict(env)
        env2[node.name] = f"v_{node.name}"
        post = self.exprs(g.epilogue, xs, "i", env2, args)
        result = env2[out.name]
        otype = _CTYPE.get(out.dtype, "float")
        block = min(tun.block_size, 1024)
        warp = inner == 1 and tun.rows_per_block != 1 and length > 1
        if node.op in _INDEXED_SCANS:
            return self._indexed_scan(node, kernel, (length, inner, lines_n, base), (pre, post),
                                      (value, result, index, otype), args, out, block, warp)
        ident, combine = _SCANS[node.op]
        chunks = _scan_chunks(lines_n, length, tun.split_reduction)
        if not warp and chunks > 1:
            return self._chunked_scan(
                node, kernel, (length, inner, lines_n, base), chunks, pre, post,
                (value, result, index, run_t, otype), args, out,
            )
        if not warp:
            src = _thread_per_line(
                f"// {node.op} along {length} element(s) of {lines_n} line(s), thread per line",
                kernel, (index, block, args, otype), (length, inner, lines_n, base),
                [f"{run_t} run = {ident};"],
                [*pre, f"run = {combine.format(a='run', b=value)};",
                 f"const {run_t} v_{node.name} = run;", *post, f"out[i] = {result};"],
            )
            grid = max(1, min(math.ceil(lines_n / block), _MAX_GRID))
            return self._add_kernel(src, kernel, grid, block, args, out)
        warps = block // 32
        if tun.vector_width >= 4 and length > 32:
            return self._warp_scan4(node, kernel, (length, lines_n, base), (pre, post),
                                    (value, result, index, run_t, otype), args, out, block)
        src = [
            f"// {node.op} along {length} element(s) of {lines_n} line(s), warp per line: "
            "32 elements a step, shuffle scan plus carry",
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}('
            f"{args.signature([f'{otype}* __restrict__ out'])}) {{",
            "  const int lane = threadIdx.x & 31;",
            f"  for ({index} r = ({index})blockIdx.x * {warps} + (threadIdx.x >> 5); r < {lines_n}; "
            f"r += ({index})gridDim.x * {warps}) {{",
            f"    const {index} b = {base};",
            f"    {run_t} carry = {ident};",
            f"    for ({index} k0 = 0; k0 < {length}; k0 += 32) {{",
            f"      const {index} k = k0 + lane;",
            f"      const {index} i = b + (k < {length} ? k : 0);",
            f"      {run_t} run = {ident};",
            f"      if (k < {length}) {{",
            *(f"        {line}" for line in pre),
            f"        run = {value};",
            "      }",
            "#pragma unroll",
            "      for (int o = 1; o < 32; o <<= 1) {",
            f"        const {run_t} y = __shfl_up_sync(SG_FULL, run, o);",
            f"        if (lane >= o) run = {combine.format(a='y', b='run')};",
            "      }",
            f"      run = {combine.format(a='carry', b='run')};",
            "      carry = __shfl_sync(SG_FULL, run, 31);",
            f"      if (k < {length}) {{",
            f"        const {run_t} v_{node.name} = run;",
            *(f"        {line}" for line in post),
            f"        out[i] = {result};",
            "      }",
            "    }",
            "  }",
            "}",
        ]
        grid = max(1, min(math.ceil(lines_n / warps), _MAX_GRID))
        return self._add_kernel(src, kernel, grid, block, args, out)

    def _warp_scan4(
        self, node: Any, kernel: str, layout: tuple[int, str, str], code: tuple[list[str], list[str]],
        spelled: tuple[str, str, str, str, str], args: Any, out: Any, block: int,
    ) -> list[str]:
        """A warp a contiguous line, 128 elements a step as four coalesced runs of 32: the four
        shuffle scans interleave, then each run starts from the carry and the runs before it.
        Steps of 32 (``vector_width`` 1) keep one load a lane in flight, each waiting on the
        shuffle chain before it: too few bytes in flight to fill the memory bus."""
        length, lines_n, base = layout
        pre, post = code
        value, result, index, run_t, otype = spelled
        ident, combine = _SCANS[node.op]
        warps = block // 32
        # a float sum's carry in double: its rounding no longer grows with the line
        carry_t = "double" if node.op == "cumsum" and run_t == "float" else run_t

        def each(body: list[str]) -> list[str]:
            return ["#pragma unroll", "      for (int e = 0; e < 4; ++e) {",
                    f"        const {index} k = k0 + e * 32 + lane;",
                    *(f"        {line}" for line in body), "      }"]

        src = [
            f"// {node.op} along {length} element(s) of {lines_n} line(s), warp per line: "
            "128 elements a step as four runs of 32, shuffle scans plus "
            f"{'a double ' if carry_t == 'double' else ''}carry",
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}('
            f"{args.signature([f'{otype}* __restrict__ out'])}) {{",
            "  const int lane = threadIdx.x & 31;",
            f"  for ({index} r = ({index})blockIdx.x * {warps} + (threadIdx.x >> 5); r < {lines_n}; "
            f"r += ({index})gridDim.x * {warps}) {{",
            f"    const {index} b = {base};",
            f"    {carry_t} carry = {ident};",
            f"    for ({index} k0 = 0; k0 < {length}; k0 += 128) {{",
            f"      {run_t} run[4];",
            *each([
                f"run[e] = {ident};",
                f"if (k < {length}) {{",
                f"  const {index} i = b + k;",
                *(f"  {line}" for line in pre),
                f"  run[e] = {value};",
                "}",
            ]),
            "#pragma unroll",
            "      for (int o = 1; o < 32; o <<= 1) {",
            "#pragma unroll",
            "        for (int e = 0; e < 4; ++e) {",
            f"          const {run_t} y = __shfl_up_sync(SG_FULL, run[e], o);",
            f"          if (lane >= o) run[e] = {combine.format(a='y', b='run[e]')};",
            "        }",
            "      }",
            *each([
                f"const {run_t} total = __shfl_sync(SG_FULL, run[e], 31);",
                f"if (k < {length}) {{",
                f"  const {index} i = b + k;",
                f"  const {run_t} v_{node.name} = ({run_t}){combine.format(a='carry', b='run[e]')};",
                *(f"  {line}" for line in post),
                f"  out[i] = {result};",
                "}",
                f"carry = {combine.format(a='carry', b='total')};",
            ]),
            "    }",
            "  }",
            "}",
        ]
        grid = max(1, min(math.ceil(lines_n / warps), _MAX_GRID))
        return self._add_kernel(src, kernel, grid, block, args, out)

    def _indexed_scan(
        self, node: Any, kernel: str, layout: tuple[int, int, int, str],
        code: tuple[list[str], list[str]], spelled: tuple[str, str, str, str], args: Any,
        out: Any, block: int, warp: bool,
    ) -> list[str]:
        """The indices of ``cummax``/``cummin``: each element's running extreme carried with
        its position. Contiguous lines take a warp a line (a shuffle scan of the pairs plus a
        carry), others a thread a line."""
        length, inner, lines_n, base = layout
        pre, post = code
        value, result, index, otype = spelled
        ident = _INDEXED_SCANS[node.op][0]
        store = [f"const long long v_{node.name} = at;", *post, f"out[i] = {result};"]
        if not warp:
            src = _thread_per_line(
                f"// {node.op} along {length} element(s) of {lines_n} line(s), thread per line",
                kernel, (index, block, args, otype), (length, inner, lines_n, base),
                [f"float run = {ident};", "long long at = 0;"],
                [*pre, f"const float v = {value};",
                 f"if ({_later_wins(node.op, 'v', 'run')}) {{ run = v; at = k; }}", *store],
            )
            grid = max(1, min(math.ceil(lines_n / block), _MAX_GRID))
            return self._add_kernel(src, kernel, grid, block, args, out)
        warps = block // 32
        src = [
            f"// {node.op} along {length} element(s) of {lines_n} line(s), warp per line: "
            "32 elements a step, shuffle scan of (extreme, position) plus carry",
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}('
            f"{args.signature([f'{otype}* __restrict__ out'])}) {{",
            "  const int lane = threadIdx.x & 31;",
            f"  for ({index} r = ({index})blockIdx.x * {warps} + (threadIdx.x >> 5); r < {lines_n}; "
            f"r += ({index})gridDim.x * {warps}) {{",
            f"    const {index} b = {base};",
            f"    float carry = {ident};",
            "    long long carry_at = 0;",
            f"    for ({index} k0 = 0; k0 < {length}; k0 += 32) {{",
            f"      const {index} k = k0 + lane;",
            f"      const {index} i = b + (k < {length} ? k : 0);",
            f"      float run = {ident};",
            "      long long at = k;",
            f"      if (k < {length}) {{",
            *(f"        {line}" for line in pre),
            f"        run = {value};",
            "      }",
            "#pragma unroll",
            "      for (int o = 1; o < 32; o <<= 1) {",
            "        const float y = __shfl_up_sync(SG_FULL, run, o);",
            "        const long long y_at = __shfl_up_sync(SG_FULL, at, o);",
            f"        if (lane >= o && !{_later_wins(node.op, 'run', 'y')}) {{ run = y; at = y_at; }}",
            "      }",
            f"      if (!{_later_wins(node.op, 'run', 'carry')}) {{ run = carry; at = carry_at; }}",
            "      carry = __shfl_sync(SG_FULL, run, 31);",
            "      carry_at = __shfl_sync(SG_FULL, at, 31);",
            f"      if (k < {length}) {{",
            *(f"        {line}" for line in store),
            "      }",
            "    }",
            "  }",
            "}",
        ]
        grid = max(1, min(math.ceil(lines_n / warps), _MAX_GRID))
        return self._add_kernel(src, kernel, grid, block, args, out)
