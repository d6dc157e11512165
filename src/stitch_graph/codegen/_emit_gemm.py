"""GEMMs: linear, matmul (mm, bmm) and addmm through cuBLAS (true FP32), followed by one
epilogue kernel.

``_GemmEmitter`` is a mixin of ``emit._Emitter``.
"""

from __future__ import annotations

from stitch_graph.codegen._emit_base import EmitError, _Args, _EmitterBase, _literal, _py
from stitch_graph.codegen.ir import Group, Ref, matrix_layout, numel
from stitch_graph.codegen.tuning import KernelTuning


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
            m = numel(ir.shapes[a_ref]) // k
            a_layout, b_layout = (False, k, 0), (True, k, 0)
            b_ref, batch = w_ref, 1
            m_rows = m
        else:
            a_ref = node.args["mat1" if node.op == "addmm" else "input"]
            b_ref = node.args["mat2" if node.op == "addmm" else "other"]
            a_layout = matrix_layout(ir.shapes[a_ref], ir.strides[a_ref])
            b_layout = matrix_layout(ir.shapes[b_ref], ir.strides[b_ref])
            if a_layout is None or b_layout is None:
                msg = f"{node.name}: operand layout not expressible as strided-batched GEMM"
                raise EmitError(msg)
            m_rows, k = ir.shapes[a_ref][-2], ir.shapes[a_ref][-1]
            n = ir.shapes[b_ref][-1]
            batch = numel(out_shape[:-2])
        ta, lda, sa = a_layout
        tb, ldb, sb = b_layout
        bias = node.args.get("bias") if node.op == "linear" else None
        needs_epilogue = node.op == "addmm" or isinstance(bias, Ref) or bool(g.epilogue)
        product = f"{node.name}_mm" if needs_epilogue else node.name
        lines = [
            f"{product} = torch.empty({list(out_shape)}, device=_dev, dtype=torch.float32)",
            f"_sgemm({int(tb)}, {int(ta)}, {n}, {m_rows}, {k}, {_py(b_ref)}, {ldb}, {sb}, "
            f"{_py(a_ref)}, {lda}, {sa}, {product}, {n}, {m_rows * n}, {batch}"
            + (f", algo={tun.gemm_algo})" if tun.gemm_algo else ")"),
        ]
        if not needs_epilogue:
            return lines
        space = tuple(out_shape)

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
