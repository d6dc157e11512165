"""GEMMs: linear, matmul (mm, bmm) and addmm through cuBLAS (true FP32), followed by one
epilogue kernel; a linear's bias (and a ReLU that is all its epilogue) in cuBLASLt's epilogue
instead; a loop of calls over one batch dim where the operands' batches are not one stride
apart; a generated kernel for a few rows.

``_GemmEmitter`` is a mixin of ``emit._Emitter``.
"""

from __future__ import annotations

from collections.abc import Callable

from stitch_graph.codegen._emit_base import _SMS, EmitError, _Args, _EmitterBase, _literal, _py
from stitch_graph.codegen.ir import (
    Group,
    OpNode,
    Ref,
    contiguous_strides,
    gemm_loop_dim,
    layout_without,
    matrix_layout,
    numel,
    rows_layout,
)
from stitch_graph.codegen.schedule import library_epilogue_fits
from stitch_graph.codegen.tuning import KernelTuning

SKINNY_ROWS = 16  # rows a generated GEMM keeps in registers, one sum each


def _algo(tun: KernelTuning) -> list[str]:
    """The ``algo`` option of a library GEMM call, none for cuBLAS's own choice."""
    return [f"algo={tun.gemm_algo}"] if tun.gemm_algo else []


def _sgemm_line(
    sizes: tuple[bool, bool, int, int, int],
    first: tuple[str, int, int],
    second: tuple[str, int, int],
    out: tuple[str, int, int],
    batch: int,
    options: list[str],
) -> str:
    """The host's ``_sgemm`` call: ``(tb, ta, m, n, k)``, then ``(tensor, ld, batch stride)``
    of B, A and C (column-major, as cuBLAS takes them), the batch count and keyword options."""
    tb, ta, m, n, k = sizes
    head = f"_sgemm({int(tb)}, {int(ta)}, {m}, {n}, {k}"
    operands = ", ".join(f"{name}, {ld}, {stride}" for name, ld, stride in (first, second, out))
    return f"{head}, {operands}, {batch}" + "".join(f", {o}" for o in options) + ")"


class _GemmEmitter(_EmitterBase):
    """GEMM host calls and their epilogue kernel (``gemm``)."""

    # ---- GEMM ----------------------------------------------------------------------------------
    def gemm(self, g: Group, kernel: str, tun: KernelTuning) -> list[str]:
        ir = self.ir
        node = ir.node(g.anchor or "")
        out_shape = node.shape
        if node.op == "linear":
            a_ref: Ref = node.args["input"]
            w_ref: Ref = node.args["weight"]
            k = ir.shapes[w_ref][1]
            n = ir.shapes[w_ref][0]
            a_shape = ir.shapes[a_ref]
            # a weight's rows may lie apart (a column slice of a wider weight)
            a_layout, b_layout = (False, k, 0), (True, ir.strides[w_ref][0], 0)
            b_ref, batch = w_ref, 1
            m_rows = numel(a_shape) // k
            c_layout = (n, m_rows * n)
            rows = None if ir.is_contiguous(a_ref) else rows_layout(a_shape, ir.strides[a_ref], n)
            if rows is not None:  # rows of a permuted view: the leading dim with the most
                m_rows, lda, sa, ldc, sc, batch = rows
                a_layout, c_layout = (False, lda, sa), (ldc, sc)
            elif not ir.is_contiguous(a_ref):  # a transposed view: its matrices as they lie
                layout = matrix_layout(a_shape, ir.strides[a_ref])
                if layout is None:
                    msg = f"{node.name}: input layout not expressible as strided-batched GEMM"
                    raise EmitError(msg)
                a_layout, m_rows, batch = layout, a_shape[-2], numel(a_shape[:-2])
                c_layout = (n, m_rows * n)
        else:
            a_ref = node.args["mat1" if node.op == "addmm" else "input"]
            b_ref = node.args["mat2" if node.op == "addmm" else "other"]
            a_layout = matrix_layout(ir.shapes[a_ref], ir.strides[a_ref])
            b_layout = matrix_layout(ir.shapes[b_ref], ir.strides[b_ref])
            if a_layout is None or b_layout is None:
                return self._with_epilogue(g, kernel, tun, lambda c: self._looped_call(node, c, tun))
            m_rows, k = ir.shapes[a_ref][-2], ir.shapes[a_ref][-1]
            n = ir.shapes[b_ref][-1]
            batch = numel(out_shape[:-2])
            c_layout = (n, m_rows * n)
        ta, lda, sa = a_layout
        tb, ldb, sb = b_layout
        bias = node.args.get("bias") if node.op == "linear" else None
        if tun.gemm_kernel:
            if batch != 1 or ta or not tb or m_rows > SKINNY_ROWS or node.op == "addmm":
                msg = f"{node.name}: a generated GEMM takes at most {SKINNY_ROWS} rows, one batch"
                raise EmitError(msg)
            return self._skinny_gemm(
                g, kernel, tun, (a_ref, lda), (b_ref, ldb), bias, (m_rows, n, k)
            )

        def call(product: str, options: list[str]) -> str:
            return _sgemm_line(
                (tb, ta, n, m_rows, k), (_py(b_ref), ldb, sb), (_py(a_ref), lda, sa),
                (product, *c_layout), batch, options,
            )

        library = self._library_epilogue(g, tun, bias, batch)
        if library is not None:  # cuBLASLt stores the group's output itself
            return [
                f"{g.output} = torch.empty({list(out_shape)}, device=_dev, dtype=torch.float32)",
                call(g.output, [f"algo={tun.gemm_algo}", *library]),
            ]
        return self._with_epilogue(g, kernel, tun, lambda c: [call(c, _algo(tun))], bias)

    def _with_epilogue(
        self,
        g: Group,
        kernel: str,
        tun: KernelTuning,
        calls: Callable[[str], list[str]],
        bias: object = None,
    ) -> list[str]:
        """The product's buffer and ``calls`` writing it; then, where a bias, an ``addmm``'s
        addend or the group's epilogue follow, the product is the anchor's raw value and one
        pointwise kernel computes the rest."""
        ir = self.ir
        node = ir.node(g.anchor or "")
        space = tuple(node.shape)
        needs_epilogue = node.op == "addmm" or isinstance(bias, Ref) or bool(g.epilogue)
        product = f"{node.name}_mm" if needs_epilogue else node.name
        lines = [
            f"{product} = torch.empty({list(space)}, device=_dev, dtype=torch.float32)",
            *calls(product),
        ]
        if not needs_epilogue:
            return lines

        def anchor_line(args: _Args, idx: str) -> tuple[str, str]:
            raw = args.load(Ref("node", product), space, idx, space)
            if isinstance(bias, Ref):
                addend = args.load(bias, space, idx)
                return node.name, f"const float v_{node.name} = {raw} + {addend};"
            if node.op == "addmm":
                alpha = _literal(node.args.get("alpha", 1))
                beta = _literal(node.args.get("beta", 1))
                addend = self.value_of(node.args["input"], space, idx, {}, args)
                return (
                    node.name,
                    f"const float v_{node.name} = {alpha} * {raw} + {beta} * {addend};",
                )
            return node.name, f"const float v_{node.name} = {raw};"

        out = ir.node(g.output)
        return lines + self.pointwise(g.id, kernel, g.epilogue, out, tun, anchor_line)

    def _looped_call(self, node: OpNode, product: str, tun: KernelTuning) -> list[str]:
        """A batched product whose operands' batches are not one stride apart: a loop over
        one batch dim (``gemm_loop_dim``), each call a strided-batched GEMM of the others
        on views of the operands and the result."""
        ir = self.ir
        o = gemm_loop_dim(ir, node)
        if o is None:
            msg = f"{node.name}: operand layout not expressible as strided-batched GEMM"
            raise EmitError(msg)
        a_ref, b_ref = node.args["input"], node.args["other"]
        shape = tuple(node.shape)
        ta, lda, sa = layout_without(ir.shapes[a_ref], ir.strides[a_ref], o)
        tb, ldb, sb = layout_without(ir.shapes[b_ref], ir.strides[b_ref], o)
        _, _, sc = layout_without(shape, contiguous_strides(shape), o)
        m_rows, k, n = shape[-2], ir.shapes[a_ref][-1], shape[-1]
        each = f".select({o}, _i)"
        call = _sgemm_line(
            (tb, ta, n, m_rows, k), (_py(b_ref) + each, ldb, sb), (_py(a_ref) + each, lda, sa),
            (product + each, n, sc), numel(shape[:-2]) // shape[o], _algo(tun),
        )
        return [f"for _i in range({shape[o]}):", f"    {call}"]

    def _library_epilogue(
        self, g: Group, tun: KernelTuning, bias: object, batch: int
    ) -> list[str] | None:
        """The ``_sgemm`` options that have cuBLASLt's epilogue add a linear layer's bias (and
        apply the ReLU that is all its epilogue, if so) as the GEMM stores its result, where
        a generated kernel would read the product back and write it again; ``None`` where the
        tuning turns it off or the epilogue holds anything else."""
        if (
            not tun.gemm_epilogue
            or batch != 1
            or g.output in self.cat_slices
            or not library_epilogue_fits(self.ir, g)
        ):
            return None
        return [f"bias={_py(bias)}", *(["relu=True"] if g.epilogue else [])]

    def _skinny_gemm(
        self,
        g: Group,
        kernel: str,
        tun: KernelTuning,
        a: tuple[Ref, int],
        b: tuple[Ref, int],
        bias: object,
        mnk: tuple[int, int, int],
    ) -> list[str]:
        """``out[m, n] = sum_k A[m, k] B[n, k]`` (+ bias, + epilogue) for a few rows ``m``.

        A warp owns a few output columns: it reads their ``B`` rows once, coalesced (float4
        where the rows and pointers allow), and keeps every row's sum in registers, so the
        weight is read once, at memory speed, and each ``A`` load serves every owned column.
        cuBLAS ran KernelBench L3's RNN step GEMM (8 x 1280 by 1280 x 256) at 50 us without
        split-K (H200), where a read of its 1.3 MB takes under 1 us.
        """
        ir = self.ir
        node = ir.node(g.anchor or "")
        (a_ref, lda), (b_ref, ldb) = a, b
        m, n, k = mnk
        cols = max(1, min(4, SKINNY_ROWS // m))  # sums a lane holds: m * cols <= 16
        args = _Args(ir)
        pa, pb = args.param(a_ref), args.param(b_ref)
        warps = -(-n // cols)
        block = tun.block_size
        while block > 32 and -(-warps * 32 // block) < _SMS:  # a block an SM at least
            block //= 2
        wide = k % 4 == 0 and lda % 4 == 0 and ldb % 4 == 0

        def step(width: int) -> list[str]:
            """One position of the k loop: the owned columns' weights, then each row's value
            against them."""
            if width == 4:
                load = "*reinterpret_cast<const float4*>({} + c)"
                w = [f"const float4 w{j} = {load.format(f'w{j}r')};" for j in range(cols)]
                rows = []
                for r in range(m):
                    dots = " ".join(
                        f"acc{r}_{j} += w{j}.x * x.x + w{j}.y * x.y + w{j}.z * x.z + w{j}.w * x.w;"
                        for j in range(cols)
                    )
                    rows.append(
                        f"{{ const float4 x = {load.format(f'{pa} + {r * lda}')}; {dots} }}"
                    )
                return w + rows
            w = [f"const float w{j} = w{j}r[c];" for j in range(cols)]
            rows = []
            for r in range(m):
                dots = " ".join(f"acc{r}_{j} += w{j} * x;" for j in range(cols))
                rows.append(f"{{ const float x = {pa}[{r * lda} + c]; {dots} }}")
            return w + rows

        loops = [f"for (int c = lane; c < {k}; c += 32) {{", *(f"  {x}" for x in step(1)), "}"]
        if wide:
            aligned = " | ".join(f"reinterpret_cast<unsigned long long>({p})" for p in (pa, pb))
            loops = [
                f"if ((({aligned}) & 15) == 0) {{",
                "  #pragma unroll 2",
                f"  for (int c = lane * 4; c < {k}; c += 128) {{",
                *(f"    {x}" for x in step(4)),
                "  }",
                "} else {",
                *(f"  {x}" for x in loops),
                "}",
            ]
        sums = [f"acc{r}_{j}" for r in range(m) for j in range(cols)]
        space = tuple(node.shape)
        env: dict[str, str] = {node.name: f"v_{node.name}"}
        addend = f" + {args.load(bias, space, 'i')}" if isinstance(bias, Ref) else ""
        epilogue = self.exprs(g.epilogue, space, "i", env, args)
        out = ir.node(g.output)
        src = [
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}('
            f"{args.signature(['float* __restrict__ out'])}) {{",
            f"  const int col0 = (int)(((long long)blockIdx.x * {block} + threadIdx.x) >> 5)"
            f" * {cols};",
            "  const int lane = threadIdx.x & 31;",
            f"  if (col0 >= {n}) return;",
            *(
                f"  const float* __restrict__ w{j}r = {pb} + (long long)min(col0 + {j}, {n - 1})"
                f" * {ldb};"
                for j in range(cols)
            ),
            f"  float {', '.join(f'{x} = 0.f' for x in sums)};",
            *(f"  {line}" for line in loops),
            "  #pragma unroll",
            "  for (int off = 16; off > 0; off >>= 1) {",
            *(f"    {x} += __shfl_xor_sync(0xffffffffu, {x}, off);" for x in sums),
            "  }",
            f"  if (lane >= {m * cols}) return;",
            f"  const int row = lane / {cols}, col = col0 + lane % {cols};",
            f"  if (col >= {n}) return;",
            "  float sum = acc0_0;",
            *(
                f"  if (lane == {r * cols + j}) sum = acc{r}_{j};"
                for r in range(m)
                for j in range(cols)
                if r or j
            ),
            f"  const int i = row * {n} + col;",
            f"  const float v_{node.name} = sum{addend};",
            *(f"  {line}" for line in epilogue),
            f"  out[i] = {env[out.name]};",
            "}",
        ]
        grid = -(-warps * 32 // block)
        return self._add_kernel(src, kernel, grid, block, args, out)
