"""Convolutions (1-D, 2-D, 3-D, grouped, transposed): im2col + cuBLAS SGEMM, SGEMM + col2im,
cuDNN, or a direct kernel with the epilogue fused.

Holds the geometry (``_ConvGeom``), the scratch limits and the functions that pick a path, as
well as ``_ConvEmitter``, a mixin of ``emit._Emitter``. Tests patch ``_CONV_SCRATCH_BYTES`` here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from stitch_graph.codegen._emit_base import _MAX_GRID, EmitError, _Args, _EmitterBase, _py
from stitch_graph.codegen.ir import Group, OpNode, ProgramIR, Ref, numel
from stitch_graph.codegen.tuning import KernelTuning

# Convolutions run as im2col + cuBLAS SGEMM (one SGEMM per group when grouped); the im2col scratch
# of one chunk of images stays under _CONV_SCRATCH_BYTES (one image at a time if a single image
# needs more, up to _CONV_SCRATCH_MAX per image; beyond that, and for a per-group K = C/groups*KH*KW
# or, when grouped, a per-group output channel count below _CONV_GEMM_MIN_K, the direct kernel is
# kept: a GEMM with a tiny inner or outer dimension is all memory traffic).
_CONV_SCRATCH_BYTES = 256 * 2**20
_CONV_SCRATCH_MAX = 2 * 2**30
_CONV_GEMM_MIN_K = 16


@dataclass(frozen=True)
class _ConvGeom:
    """Geometry of a conv1d/2d/3d (conv1d as KH = H = OH = 1; conv1d/2d as KD = D = OD = 1)."""

    n: int
    cin: int
    h: int
    w: int
    cout: int
    kh: int
    kw: int
    oh: int
    ow: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int
    d: int = 1
    kd: int = 1
    od: int = 1
    sd: int = 1
    pd: int = 0
    dd: int = 1

    @property
    def k(self) -> int:
        """Inner GEMM dimension C*KD*KH*KW (rows of the unfolded input)."""
        return self.cin * self.kd * self.kh * self.kw

    @property
    def p(self) -> int:
        """Output pixels per image OD*OH*OW (columns of the unfolded input)."""
        return self.od * self.oh * self.ow

    @property
    def pointwise(self) -> bool:
        """1x1, stride 1, no padding: the input image already is the [C, H*W] matrix."""
        kernel = (self.kd, self.kh, self.kw, self.sd, self.sh, self.sw)
        return kernel == (1,) * 6 and (self.pd, self.ph, self.pw) == (0, 0, 0)


def _conv_chunk(geo: _ConvGeom) -> tuple[int, int]:
    """Images per im2col chunk and the number of chunks (balanced: the last is not a sliver)."""
    return _conv_chunk_sizes(geo.n, geo.k * geo.p * 4)


def _conv_chunk_sizes(n: int, per_image: int) -> tuple[int, int]:
    most = max(1, _CONV_SCRATCH_BYTES // max(per_image, 1))
    chunks = math.ceil(n / most)
    return math.ceil(n / chunks), chunks


def _col2im_elems(geo: _ConvGeom) -> int:
    """Elements of one image's col2im buffer: OC*KD*KH*KW rows of D*H*W input pixels."""
    return geo.cout * geo.kd * geo.kh * geo.kw * geo.d * geo.h * geo.w


def _plain_operands(ir: ProgramIR, node: OpNode, g: Group) -> bool:
    """What every library or GEMM path needs: FP32 operands, a contiguous input and weight that
    the call reads as they are (no fused prologue in front of the convolution)."""
    x, w, b = node.args["input"], node.args["weight"], node.args.get("bias")
    refs = [x, w, *([b] if isinstance(b, Ref) else [])]
    return (
        not g.prologue
        and node.dtype == "float32"
        and all(ir.dtypes.get(r, "float32") == "float32" for r in refs)
        and ir.is_contiguous(x)
        and ir.is_contiguous(w)
    )


def _conv_transpose_gemm_ok(ir: ProgramIR, node: OpNode, g: Group, geo: _ConvGeom) -> bool:
    """Whether a groups=1 transposed convolution takes the SGEMM + col2im path."""
    return (
        _plain_operands(ir, node, g)
        and geo.cin >= _CONV_GEMM_MIN_K
        and _col2im_elems(geo) * 4 <= _CONV_SCRATCH_MAX
    )


def _conv_library_ok(ir: ProgramIR, node: OpNode, g: Group, geo: _ConvGeom) -> bool:
    """Whether cuDNN can run the convolution as captured: FP32, contiguous, output shape as the
    stride/padding/dilation give it (a transposed one within its output padding)."""
    dims = [
        (geo.d, geo.od, geo.kd, geo.sd, geo.pd, geo.dd),
        (geo.h, geo.oh, geo.kh, geo.sh, geo.ph, geo.dh),
        (geo.w, geo.ow, geo.kw, geo.sw, geo.pw, geo.dw),
    ]
    if node.op.startswith("conv_transpose"):
        shapes_ok = all(
            0 <= o - ((i - 1) * s - 2 * p + dl * (k - 1) + 1) < max(s, dl)
            for i, o, k, s, p, dl in dims
        )
    else:
        shapes_ok = all(o == (i + 2 * p - dl * (k - 1) - 1) // s + 1 for i, o, k, s, p, dl in dims)
    return shapes_ok and _plain_operands(ir, node, g)


def _conv_transpose_as_conv(geo: _ConvGeom) -> _ConvGeom | None:
    """The ordinary convolution a stride-1 transposed one equals, or None.

    With stride 1, ``out[o] = sum_k x[o + p - k*dil] w[k]`` is a convolution of x with the flipped
    filter and padding ``dil*(K-1) - p`` (same dilation); that padding must not be negative.
    Output padding shows up as an output size the convolution does not produce, which
    ``_conv_gemm_ok`` refuses.
    """
    if (geo.sd, geo.sh, geo.sw) != (1, 1, 1):
        return None
    pads = [
        dil * (k - 1) - p
        for dil, k, p in ((geo.dd, geo.kd, geo.pd), (geo.dh, geo.kh, geo.ph), (geo.dw, geo.kw, geo.pw))
    ]
    if min(pads) < 0:
        return None
    return replace(geo, pd=pads[0], ph=pads[1], pw=pads[2])


def _conv_gemm_ok(
    ir: ProgramIR, node: OpNode, g: Group, geo: _ConvGeom, groups: int = 1
) -> bool:
    """Whether a convolution takes the im2col + cuBLAS path (one SGEMM per group)."""
    return (
        _plain_operands(ir, node, g)
        and geo.k // groups >= _CONV_GEMM_MIN_K
        and (groups == 1 or geo.cout // groups >= _CONV_GEMM_MIN_K)
        and (geo.pointwise or geo.k * geo.p * 4 <= _CONV_SCRATCH_MAX)
        and geo.od == (geo.d + 2 * geo.pd - geo.dd * (geo.kd - 1) - 1) // geo.sd + 1
        and geo.oh == (geo.h + 2 * geo.ph - geo.dh * (geo.kh - 1) - 1) // geo.sh + 1
        and geo.ow == (geo.w + 2 * geo.pw - geo.dw * (geo.kw - 1) - 1) // geo.sw + 1
    )


def _conv_transpose_via_im2col(
    ir: ProgramIR, node: OpNode, g: Group, geo: _ConvGeom, groups: int, col2im: bool
) -> _ConvGeom | None:
    """The convolution geometry to run a transposed convolution as, or None to keep it.

    Taken when the equivalent convolution can take the im2col path, unless the col2im path is
    open too and its column buffer is less than half the im2col one (many more input than output
    channels): both paths write their buffer once and read it once, so traffic follows its size.
    A 1x1 convolution needs no buffer at all.
    """
    fwd = _conv_transpose_as_conv(geo)
    if fwd is None or not _conv_gemm_ok(ir, node, g, fwd, groups):
        return None
    if col2im and not fwd.pointwise and fwd.k * fwd.p > 2 * _col2im_elems(geo):
        return None
    return fwd


class _ConvEmitter(_EmitterBase):
    """Convolution kernels and host calls (``conv``)."""

    # ---- convolution ---------------------------------------------------------------------------
    def _conv_geometry(self, node: OpNode) -> tuple[_ConvGeom, int]:
        """Geometry and groups of a conv1d/2d/3d or transposed convolution (missing dims 1)."""
        ir = self.ir
        xs, ws = ir.shapes[node.args["input"]], ir.shapes[node.args["weight"]]
        os_ = node.shape
        nd = len(xs) - 2
        if nd not in (1, 2, 3) or len(os_) != len(xs) or len(ws) != len(xs):
            msg = f"{node.name}: {node.op} needs a batched (N, C, ...) input"
            raise EmitError(msg)
        groups = int(node.args.get("groups", 1) or 1)

        def per_dim(value: Any, fill: int) -> list[int]:
            if value is None:
                value = fill
            vals = [int(v) for v in value] if isinstance(value, list | tuple) else [int(value)]
            vals = vals * nd if len(vals) == 1 else vals
            return [fill] * (3 - nd) + vals

        def spatial(shape: tuple[int, ...]) -> list[int]:
            return [1] * (3 - nd) + [int(v) for v in shape[2:]]

        padding = node.args.get("padding", 0)
        pd, ph, pw = [0, 0, 0] if padding == "valid" else per_dim(padding, 0)
        d, h, wd = spatial(xs)
        kd, kh, kw = spatial(ws)
        od, oh, ow = spatial(os_)
        sd, sh, sw = per_dim(node.args.get("stride", 1), 1)
        dd, dh, dw = per_dim(node.args.get("dilation", 1), 1)
        cout = ws[1] * groups if node.op.startswith("conv_transpose") else ws[0]
        geo = _ConvGeom(
            xs[0], xs[1], h, wd, cout, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, d, kd, od, sd, pd, dd
        )
        return geo, groups

    def conv(self, g: Group, kernel: str, tun: KernelTuning) -> list[str]:
        ir = self.ir
        node = ir.node(g.anchor or "")
        x: Ref = node.args["input"]
        w: Ref = node.args["weight"]
        b = node.args.get("bias")
        xs, ws, os_ = ir.shapes[x], ir.shapes[w], node.shape
        geo, groups = self._conv_geometry(node)
        if not ir.is_contiguous(w) or (isinstance(b, Ref) and not ir.is_contiguous(b)):
            msg = f"{node.name}: every path reads the weight and bias as contiguous (capture copies views)"
            raise EmitError(msg)
        transposed = node.op.startswith("conv_transpose")
        three = len(xs) == 5
        if tun.conv_library and _conv_library_ok(ir, node, g, geo):
            return self._conv_library(g, kernel, tun, geo, groups)
        if transposed:
            col2im = groups == 1 and _conv_transpose_gemm_ok(ir, node, g, geo)
            fwd = _conv_transpose_via_im2col(ir, node, g, geo, groups, col2im)
            if fwd is not None:
                lines, weight = self._flipped_weight(g, kernel, tun, geo, groups)
                return lines + self._conv_gemm(g, kernel, tun, fwd, groups, weight)
            if col2im:
                return self._conv_transpose_gemm(g, kernel, tun, geo)
        elif _conv_gemm_ok(ir, node, g, geo, groups):
            return self._conv_gemm(g, kernel, tun, geo, groups)
        cin, cout = geo.cin, geo.cout
        cig = cin // groups
        cog = cout // groups
        total = numel(os_)
        index = "long long" if total >= 2**31 or numel(xs) >= 2**31 else "int"
        out = ir.node(g.output)
        args = _Args(ir)
        xa, wa = args.param(x), args.param(w)
        init = f"{args.param(b)}[co]" if isinstance(b, Ref) else "0.f"
        env = {node.name: f"v_{node.name}"}
        post = self.exprs(g.epilogue, os_, "idx", env, args)
        block = tun.block_size
        unroll = f"#pragma unroll {tun.unroll}" if tun.unroll > 1 else "#pragma unroll"
        plane = geo.od * geo.oh * geo.ow
        in_plane = geo.d * geo.h * geo.w
        taps = geo.kd * geo.kh * geo.kw
        coords = [
            f"    const int ox = idx % {geo.ow};",
            f"    const int oy = (idx / {geo.ow}) % {geo.oh};",
            *([f"    const int oz = (idx / {geo.ow * geo.oh}) % {geo.od};"] if three else []),
            f"    const int co = (idx / {plane}) % {cout};",
            f"    const {index} nb = idx / {plane * cout};",
            f"    const int g = co / {cog};",
        ]

        def tap(axis: str, k: str, o: str, stride: int, pad: int, dil: int, size: int) -> list[str]:
            """Lines that set input coordinate ``i<axis>`` for tap ``k`` (or skip the tap)."""
            if not transposed:
                return [
                    f"const int i{axis} = {o} * {stride} - {pad} + {k} * {dil};",
                    f"if (i{axis} < 0 || i{axis} >= {size}) continue;",
                ]
            t = f"t{axis}"
            skip = f"{t} < 0" + (f" || {t} % {stride} != 0" if stride > 1 else "")
            return [
                f"const int {t} = {o} + {pad} - {k} * {dil};",
                f"if ({skip}) continue;",
                f"const int i{axis} = {t}" + (f" / {stride};" if stride > 1 else ";"),
                f"if (i{axis} >= {size}) continue;",
            ]

        loops: list[list[str]] = []
        if three:
            loops.append(
                [f"for (int kz = 0; kz < {geo.kd}; ++kz) {{"]
                + tap("z", "kz", "oz", geo.sd, geo.pd, geo.dd, geo.d)
            )
        loops.append(
            [f"for (int ky = 0; ky < {geo.kh}; ++ky) {{"]
            + tap("y", "ky", "oy", geo.sh, geo.ph, geo.dh, geo.h)
        )
        loops.append(
            [f"for (int kx = 0; kx < {geo.kw}; ++kx) {{"]
            + tap("x", "kx", "ox", geo.sw, geo.pw, geo.dw, geo.w)
        )
        x_off = "(iz * {h} + iy) * {w} + ix" if three else "iy * {w} + ix"
        w_off = "(kz * {kh} + ky) * {kw} + kx" if three else "ky * {kw} + kx"
        x_off = x_off.format(h=geo.h, w=geo.w)
        w_off = w_off.format(kh=geo.kh, kw=geo.kw)
        w_base = (
            f"((g * {cig} + ci) * {cog} + co % {cog}) * {taps}"
            if transposed
            else f"(co * {cig} + ci) * {taps}"
        )
        nest: list[str] = []
        for depth, loop in enumerate(loops):
            pad_ = "  " * depth
            nest += [f"      {pad_}{unroll}", f"      {pad_}{loop[0]}"]
            nest += [f"        {pad_}{line}" for line in loop[1:]]
        inner = "  " * len(loops)
        nest.append(f"      {inner}acc = fmaf(__ldg(xp + {x_off}), __ldg(wp + {w_off}), acc);")
        nest += [f"      {'  ' * d}}}" for d in range(len(loops) - 1, -1, -1)]
        what = "transposed " if transposed else ""
        src_lines = [
            f"// direct {what}{node.op}: {list(xs)} * {list(ws)} -> {list(os_)}, "
            "one output per thread",
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}('
            f"{args.signature(['float* __restrict__ out'])}) {{",
            f"  for ({index} idx = ({index})blockIdx.x * {block} + threadIdx.x; idx < {total}; "
            f"idx += ({index})gridDim.x * {block}) {{",
            *coords,
            f"    float acc = {init};",
            f"    for (int ci = 0; ci < {cig}; ++ci) {{",
            f"      const float* xp = {xa} + (nb * {cin} + g * {cig} + ci) * {in_plane};",
            f"      const float* wp = {wa} + {w_base};",
            *nest,
            "    }",
            f"    const float v_{node.name} = acc;",
            *(f"    {line}" for line in post),
            f"    out[idx] = {env[out.name]};",
            "  }",
            "}",
        ]
        grid = max(1, min(math.ceil(total / block), _MAX_GRID * 4))
        return self._add_kernel(src_lines, kernel, grid, block, args, out)

    def _conv_transpose_gemm(
        self, g: Group, kernel: str, tun: KernelTuning, geo: _ConvGeom
    ) -> list[str]:
        """Transposed convolution (groups = 1) as cuBLAS SGEMM + a col2im gather.

        Row-major, image n: ``col[n] (OC*K x P) = W^T (OC*K x C) @ x[n] (C x P)`` with K =
        KD*KH*KW, P = D*H*W (input pixels) and W's [C, OC, KD, KH, KW] layout read as a C x OC*K
        matrix. Column-major, cuBLAS computes ``col[n]^T (P x OC*K) = x[n]^T (P x C) @ W (C x
        OC*K)``: A = x[n] as is (lda = P), B = W transposed (ldb = OC*K), C = col[n] (ldc = P),
        batched over the images of a chunk. Each output element then gathers its taps: for tap
        (kz, ky, kx) the input pixel is ``(o + pad - k*dil) / stride`` per dim when that divides
        exactly and lies inside the input; the bias and the fused epilogue follow in the same
        kernel when the whole batch fits one chunk, else in a second pointwise kernel.
        """
        ir = self.ir
        node = ir.node(g.anchor or "")
        x: Ref = node.args["input"]
        w: Ref = node.args["weight"]
        b = node.args.get("bias")
        out = ir.node(g.output)
        space = tuple(node.shape)
        three = len(space) == 5
        taps = geo.kd * geo.kh * geo.kw
        pin = geo.d * geo.h * geo.w
        rows = geo.cout * taps
        chunk, nchunks = _conv_chunk_sizes(geo.n, rows * pin * 4)
        col = f"_col_{g.id}"
        plane = geo.od * geo.oh * geo.ow
        col_big = chunk * rows * pin >= 2**31
        cidx = "long long" if col_big else "int"

        def gather(col_name: str, bias: str | None, idx: str, name: str) -> list[str]:
            lines = [
                f"float v_{name};",
                "{",
                f"  const int ox = (int)({idx} % {geo.ow});",
                f"  const int oy = (int)(({idx} / {geo.ow}) % {geo.oh});",
                *([f"  const int oz = (int)(({idx} / {geo.ow * geo.oh}) % {geo.od});"] if three else []),  # noqa: E501
                f"  const int co = (int)(({idx} / {plane}) % {geo.cout});",
                f"  const {cidx} nb = ({cidx})({idx} / {plane * geo.cout});",
                f"  const float* cp = {col_name} + (nb * {rows} + ({cidx})co * {taps}) * {pin};",
                f"  float acc = {bias or '0.f'};",
            ]
            dims = [("y", "ky", "oy", geo.sh, geo.ph, geo.dh, geo.h, geo.kh)]
            dims.append(("x", "kx", "ox", geo.sw, geo.pw, geo.dw, geo.w, geo.kw))
            if three:
                dims.insert(0, ("z", "kz", "oz", geo.sd, geo.pd, geo.dd, geo.d, geo.kd))
            depth = 1
            for axis, k, o, stride, pad, dil, size, kk in dims:
                ind = "  " * depth
                t = f"t{axis}"
                skip = f"{t} < 0" + (f" || {t} % {stride} != 0" if stride > 1 else "")
                lines += [
                    f"{ind}for (int {k} = 0; {k} < {kk}; ++{k}) {{",
                    f"{ind}  const int {t} = {o} + {pad} - {k} * {dil};",
                    f"{ind}  if ({skip}) continue;",
                    f"{ind}  const int i{axis} = {t}" + (f" / {stride};" if stride > 1 else ";"),
                    f"{ind}  if (i{axis} >= {size}) continue;",
                ]
                depth += 1
            tap_ = "(kz * {kh} + ky) * {kw} + kx" if three else "ky * {kw} + kx"
            pix = "(iz * {h} + iy) * {w} + ix" if three else "iy * {w} + ix"
            tap_ = tap_.format(kh=geo.kh, kw=geo.kw)
            pix = pix.format(h=geo.h, w=geo.w)
            ind = "  " * depth
            lines.append(f"{ind}acc += __ldg(cp + ({cidx})({tap_}) * {pin} + {pix});")
            lines += ["  " * d + "}" for d in range(depth - 1, 0, -1)]
            lines += [f"  v_{name} = acc;", "}"]
            return lines

        lines = [
            f"# transposed conv by parts: SGEMM of {chunk} image(s) at a time into {col} "
            f"[{chunk}, {rows}, {pin}] ({chunk * rows * pin * 4 / 2**20:.1f} MiB), then a gather",
            f"{col} = torch.empty([{chunk}, {rows}, {pin}], device=_dev, dtype=torch.float32)",
        ]
        gemm = (
            f"_sgemm(0, 1, {pin}, {rows}, {geo.cin}, {{x}}, {pin}, {geo.cin * pin}, {_py(w)}, "
            f"{rows}, 0, {col}, {pin}, {rows * pin}, {{cnt}})"
        )
        if nchunks == 1:
            lines.append(gemm.format(x=_py(x), cnt=geo.n))

            def anchor_line(args: _Args, idx: str) -> tuple[str, str]:
                col_arg = args.param(Ref("node", col))
                bias = f"{args.param(b)}[({idx} / {plane}) % {geo.cout}]" if isinstance(b, Ref) else None
                return node.name, "\n    ".join(gather(col_arg, bias, idx, node.name))

            return lines + self.pointwise(g.id, kernel, g.epilogue, out, tun, anchor_line)
        product = f"{node.name}_ct" if g.epilogue else node.name
        args = _Args(ir)
        bias = f"{args.param(b)}[co]" if isinstance(b, Ref) else None
        block = tun.block_size
        n_out = chunk * geo.cout * plane
        oidx = "long long" if n_out >= 2**31 else "int"
        body = gather("col", bias, "i", node.name)
        src = [
            f"// col2im gather for {node.op}: cnt image(s) of {list(space[1:])} from col "
            f"[cnt, {rows}, {pin}]",
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}_col2im('
            f"{args.signature(['const float* __restrict__ col', 'float* __restrict__ out', 'int cnt'])}) {{",  # noqa: E501
            f"  const {oidx} total = ({oidx})cnt * {geo.cout * plane};",
            f"  for ({oidx} i = ({oidx})blockIdx.x * {block} + threadIdx.x; i < total; "
            f"i += ({oidx})gridDim.x * {block}) {{",
            *(f"    {line}" for line in body),
            f"    out[i] = v_{node.name};",
            "  }",
            "}",
        ]
        self.kernels.append("\n".join(src))
        grid = max(1, min(math.ceil(n_out / block), _MAX_GRID))
        refs = "".join(f"{_py(r)}, " for r in args.refs)
        lines += [
            f"{product} = torch.empty({list(space)}, device=_dev, dtype=torch.float32)",
            f"for _n0 in range(0, {geo.n}, {chunk}):",
            f"    _nc = min({chunk}, {geo.n} - _n0)",
            "    " + gemm.format(x=f"{_py(x)}[_n0:_n0 + _nc]", cnt="_nc"),
            f"    KERNELS.{kernel}_col2im({grid}, {block}, {refs}{col}, {product}[_n0:_n0 + _nc], _nc)",  # noqa: E501
        ]
        if not g.epilogue:
            return lines

        def load_product(args: _Args, idx: str) -> tuple[str, str]:
            raw = args.load(Ref("node", product), space, idx, space)
            return node.name, f"const float v_{node.name} = {raw};"

        return lines + self.pointwise(g.id, kernel, g.epilogue, out, tun, load_product)

    def _flipped_weight(
        self, g: Group, kernel: str, tun: KernelTuning, geo: _ConvGeom, groups: int
    ) -> tuple[list[str], str]:
        """A transposed convolution's weight as the equivalent convolution's, at every call.

        ``[C, OC/groups, KD, KH, KW]`` becomes ``[OC, C/groups, KD, KH, KW]`` with every spatial
        dim reversed (reversing all of them reverses the flat tap index). The weight is a
        parameter that may change between calls, so a small kernel rebuilds it in each forward.
        Returns the host lines and the name of the new weight.
        """
        node = self.ir.node(g.anchor or "")
        w: Ref = node.args["weight"]
        taps = geo.kd * geo.kh * geo.kw
        cig, cog = geo.cin // groups, geo.cout // groups
        total = geo.cout * cig * taps
        block = tun.block_size
        name = f"_wf_{g.id}"
        src = [
            f"// {node.op} weight [{geo.cin}, {cog}, {taps} taps] -> conv weight "
            f"[{geo.cout}, {cig}, {taps} taps], taps reversed ({groups} group(s))",
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}_wflip('
            "const float* __restrict__ w, float* __restrict__ out) {",
            f"  for (int i = blockIdx.x * {block} + threadIdx.x; i < {total}; "
            f"i += gridDim.x * {block}) {{",
            f"    const int t = i % {taps};",
            f"    const int ci = (i / {taps}) % {cig};",
            f"    const int co = i / {taps * cig};",
            f"    const int grp = co / {cog};",
            f"    out[i] = __ldg(w + ((grp * {cig} + ci) * {cog} + co % {cog}) * {taps} "
            f"+ {taps - 1} - t);",
            "  }",
            "}",
        ]
        self.kernels.append("\n".join(src))
        shape = [geo.cout, cig, *self.ir.shapes[w][2:]]
        grid = max(1, min(math.ceil(total / block), _MAX_GRID))
        return [
            f"# {node.op} with stride 1 as a convolution with the flipped, transposed weight",
            f"{name} = torch.empty({shape}, device=_dev, dtype=torch.float32)",
            f"KERNELS.{kernel}_wflip({grid}, {block}, {_py(w)}, {name})",
        ], name

    def _conv_gemm(
        self,
        g: Group,
        kernel: str,
        tun: KernelTuning,
        geo: _ConvGeom,
        groups: int = 1,
        weight: str | None = None,
    ) -> list[str]:
        """Convolution as implicit GEMM by parts: im2col of a chunk of images, then cuBLAS.

        Row-major, image n: ``out[n] (OC x P) = W (OC x K) @ col[n] (K x P)`` with P = OH*OW,
        K = C*KH*KW and ``col[n][(c*KH + ky)*KW + kx, oy*OW + ox] = x[n, c, oy*sh - ph + ky*dh,
        ox*sw - pw + kx*dw]`` (0 in the padding), the row order of W's [OC, C, KH, KW] layout.
        cuBLAS is column-major, and a row-major R x C matrix with leading dimension C is the
        column-major C x R matrix (its transpose) with the same leading dimension. So cuBLAS
        computes ``out[n]^T (P x OC) = col[n]^T (P x K) @ W^T (K x OC)`` with no transposes
        (ta = tb = N): m = P, n = OC, k = K; A = col[n] read as column-major P x K, lda = P, batch
        stride K*P; B = W read as column-major K x OC, ldb = K, batch stride 0 (one filter bank);
        C = out[n] read as column-major P x OC, ldc = P, batch stride OC*P, which is NCHW. A 1x1
        conv with stride 1 and no padding has col[n] == x[n] ([C, H*W]): x itself is A.
        Grouped: the rows of col[n] (and x[n]) go by input channel, so group j's are the slice
        ``[j*K/G, (j+1)*K/G)`` and its filters the rows ``[j*OC/G, (j+1)*OC/G)`` of W, whose
        [OC, C/G, ...] layout is already those K/G x OC/G matrices: one strided-batched SGEMM per
        group on views (m = P, n = OC/G, k = K/G; the same leading dims and batch strides).
        ``weight`` names the host tensor to use as W when it is not the node's own weight.
        The bias and the fused epilogue run afterwards in one pointwise kernel (as for ``gemm``).
        """
        ir = self.ir
        node = ir.node(g.anchor or "")
        x: Ref = node.args["input"]
        w: Ref = node.args["weight"]
        b = node.args.get("bias")
        space = tuple(node.shape)
        k, p, cout = geo.k, geo.p, geo.cout
        needs_epilogue = isinstance(b, Ref) or bool(g.epilogue)
        product = f"{node.name}_mm" if needs_epilogue else node.name
        xa, wa = _py(x), weight or _py(w)
        kg, cog = k // groups, cout // groups

        algo = f", algo={tun.gemm_algo}" if tun.gemm_algo else ""  # a cuBLASLt rank, by time

        def sgemm(a: str, c: str, cnt: object) -> list[str]:
            """Host lines for the SGEMM(s) of ``cnt`` images: A = ``a``, C = ``c``."""
            if groups == 1:
                return [
                    f"_sgemm(0, 0, {p}, {cout}, {k}, {a}, {p}, {k * p}, {wa}, {k}, 0, "
                    f"{c}, {p}, {cout * p}, {cnt}{algo})"
                ]
            return [
                f"for _g in range({groups}):",
                f"    _sgemm(0, 0, {p}, {cog}, {kg}, {a}[:, _g * {kg}:(_g + 1) * {kg}], {p}, "
                f"{k * p}, {wa}[_g * {cog}:(_g + 1) * {cog}], {kg}, 0, "
                f"{c}[:, _g * {cog}:(_g + 1) * {cog}], {p}, {cout * p}, {cnt})",
            ]

        lines = [f"{product} = torch.empty({list(space)}, device=_dev, dtype=torch.float32)"]
        if geo.pointwise:
            lines += [
                f"# 1x1 {node.op}, stride 1, no padding: x[n] is already the [{k}, {p}] matrix",
                *sgemm(xa, product, geo.n),
            ]
        else:
            chunk, nchunks = _conv_chunk(geo)
            block = tun.block_size
            elems = chunk * k * p
            big = max(elems, chunk * geo.cin * geo.d * geo.h * geo.w) >= 2**31
            index = "long long" if big else "int"
            unroll = f"#pragma unroll {tun.unroll}\n  " if tun.unroll > 1 else ""
            im2col = f"{kernel}_im2col"
            three = len(space) == 5
            im2col_2d = [
                f"    const int ox = q % {geo.ow}, oy = q / {geo.ow};",
                f"    const int kx = r % {geo.kw}, ky = (r / {geo.kw}) % {geo.kh};",
                f"    const int c = r / {geo.kh * geo.kw};",
                f"    const int iy = oy * {geo.sh} - {geo.ph} + ky * {geo.dh};",
                f"    const int ix = ox * {geo.sw} - {geo.pw} + kx * {geo.dw};",
                "    float v = 0.f;",
                f"    if (iy >= 0 && iy < {geo.h} && ix >= 0 && ix < {geo.w}) "
                f"v = __ldg(x + (nb * {geo.cin} + c) * {geo.h * geo.w} + iy * {geo.w} + ix);",
            ]
            im2col_3d = [  # row ((c*KD + kz)*KH + ky)*KW + kx, column (oz*OH + oy)*OW + ox
                f"    const int ox = q % {geo.ow}, oy = (q / {geo.ow}) % {geo.oh};",
                f"    const int oz = q / {geo.ow * geo.oh};",
                f"    const int kx = r % {geo.kw}, ky = (r / {geo.kw}) % {geo.kh};",
                f"    const int kz = (r / {geo.kw * geo.kh}) % {geo.kd};",
                f"    const int c = r / {geo.kd * geo.kh * geo.kw};",
                f"    const int iz = oz * {geo.sd} - {geo.pd} + kz * {geo.dd};",
                f"    const int iy = oy * {geo.sh} - {geo.ph} + ky * {geo.dh};",
                f"    const int ix = ox * {geo.sw} - {geo.pw} + kx * {geo.dw};",
                "    float v = 0.f;",
                f"    if (iz >= 0 && iz < {geo.d} && iy >= 0 && iy < {geo.h} && ix >= 0 && "
                f"ix < {geo.w}) v = __ldg(x + (nb * {geo.cin} + c) * {geo.d * geo.h * geo.w} + "
                f"(iz * {geo.h} + iy) * {geo.w} + ix);",
            ]
            src = [
                f"// im2col for {node.op}: cnt image(s) of x [{geo.cin}, {geo.h}, {geo.w}] -> "
                f"col [cnt, {k}, {p}]; row (c*{geo.kh} + ky)*{geo.kw} + kx, column oy*{geo.ow} + ox",
                f'extern "C" __global__ __launch_bounds__({block}) void {im2col}('
                "const float* __restrict__ x, float* __restrict__ col, int cnt) {",
                f"  const {index} total = ({index})cnt * {k * p};",
                f"  {unroll}for ({index} i = ({index})blockIdx.x * {block} + threadIdx.x; "
                f"i < total; i += ({index})gridDim.x * {block}) {{",
                f"    const int q = (int)(i % {p});",
                f"    const int r = (int)((i / {p}) % {k});",
                f"    const {index} nb = i / {k * p};",
                *(im2col_3d if three else im2col_2d),
                "    col[i] = v;",
                "  }",
                "}",
            ]
            self.kernels.append("\n".join(src))
            grid = max(1, min(math.ceil(elems / block), _MAX_GRID))
            col = f"_col_{g.id}"
            mib = elems * 4 / 2**20
            per_chunk = "one batched SGEMM" if groups == 1 else f"{groups} batched SGEMMs (groups)"
            lines += [
                f"# implicit GEMM by parts: im2col of {chunk} image(s) at a time into "
                f"{col} [{chunk}, {k}, {p}] ({mib:.1f} MiB), then {per_chunk} per chunk",
                f"{col} = torch.empty([{chunk}, {k}, {p}], device=_dev, dtype=torch.float32)",
            ]
            if nchunks == 1:
                lines += [
                    f"KERNELS.{im2col}({grid}, {block}, {xa}, {col}, {geo.n})",
                    *sgemm(col, product, geo.n),
                ]
            else:
                lines += [
                    f"for _n0 in range(0, {geo.n}, {chunk}):",
                    f"    _nc = min({chunk}, {geo.n} - _n0)",
                    f"    KERNELS.{im2col}({grid}, {block}, {xa}[_n0:_n0 + _nc], {col}, _nc)",
                    *(f"    {line}" for line in sgemm(col, f"{product}[_n0:_n0 + _nc]", "_nc")),
                ]
        if not needs_epilogue:
            return lines
        return lines + self._conv_epilogue(g, kernel, tun, product, cout)

    def _conv_epilogue(
        self, g: Group, kernel: str, tun: KernelTuning, product: str, cout: int
    ) -> list[str]:
        """One pointwise kernel over a library-computed convolution: its bias plus the epilogue."""
        node = self.ir.node(g.anchor or "")
        b = node.args.get("bias")
        space = tuple(node.shape)

        def anchor_line(args: _Args, idx: str) -> tuple[str, str]:
            raw = args.load(Ref("node", product), space, idx, space)
            if isinstance(b, Ref):
                addend = args.load(b, space, idx, (cout,) + (1,) * (len(space) - 2))
                return node.name, f"const float v_{node.name} = {raw} + {addend};"
            return node.name, f"const float v_{node.name} = {raw};"

        out = self.ir.node(g.output)
        return self.pointwise(g.id, kernel, g.epilogue, out, tun, anchor_line)

    def _conv_library(
        self, g: Group, kernel: str, tun: KernelTuning, geo: _ConvGeom, groups: int
    ) -> list[str]:
        """Convolution (forward or transposed, any groups) through cuDNN, then one pointwise
        kernel for the bias and the fused epilogue (none when there is neither)."""
        node = self.ir.node(g.anchor or "")
        b = node.args.get("bias")
        space = tuple(node.shape)
        nd = len(space) - 2
        needs_epilogue = isinstance(b, Ref) or bool(g.epilogue)
        product = f"{node.name}_conv" if needs_epilogue else node.name
        stride = [geo.sd, geo.sh, geo.sw][3 - nd :]
        padding = [geo.pd, geo.ph, geo.pw][3 - nd :]
        dilation = [geo.dd, geo.dh, geo.dw][3 - nd :]
        call = "conv_transpose" if node.op.startswith("conv_transpose") else "conv"
        lines = [
            f"# {node.op} through cuDNN (FP32 math, its heuristic's algorithm)"
            + ("; bias and epilogue follow in one kernel" if needs_epilogue else ""),
            f"{product} = torch.empty({list(space)}, device=_dev, dtype=torch.float32)",
            f"KERNELS.{call}({_py(node.args['input'])}, {_py(node.args['weight'])}, {product}, "
            f"{stride}, {padding}, {dilation}, {groups}"
            + (f", engine={tun.conv_engine})" if tun.conv_engine else ")"),
        ]
        if not needs_epilogue:
            return lines
        return lines + self._conv_epilogue(g, kernel, tun, product, geo.cout)
