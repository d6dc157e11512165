"""Two reductions of the same rows in one kernel, the second reading the first's per-row
result (``_fusion_row_stages``): the row's threads reduce it, every one of them gets the
result, and they read the row again for the second reduction. The second read hits L1 or L2
where the row fits; two kernels read it from memory twice and stored the result between them.

``_RowStagesEmitter`` is a mixin of ``emit._Emitter``.
"""

from __future__ import annotations

import math

from stitch_graph.codegen._emit_base import (
    _CTYPE,
    _MAX_GRID,
    _TORCH_DTYPE,
    EmitError,
    _Args,
    _EmitterBase,
)
from stitch_graph.codegen._emit_reduce import _row_combine, _row_threads
from stitch_graph.codegen._fusion_row_stages import (
    readers_past_views,
    row_value_source,
    stages,
)
from stitch_graph.codegen._reduce_accumulators import _accumulator, _reduced
from stitch_graph.codegen.ir import Group, Ref, numel, row_layout
from stitch_graph.codegen.schedule import is_view, reduction_dims
from stitch_graph.codegen.tuning import KernelTuning


class _RowStagesEmitter(_EmitterBase):
    """The kernel of a reduction group with a ``before`` stage."""

    def staged_reduction(self, g: Group, kernel: str, tun: KernelTuning) -> list[str]:
        ir = self.ir
        if g.before is None:
            msg = f"{g.id}: a staged reduction needs its first stage"
            raise EmitError(msg)
        anchor = ir.node(g.anchor or "")
        in_shape = ir.shapes[anchor.args["input"]]
        layout = row_layout(in_shape, reduction_dims(ir, anchor))
        if layout is None or layout[2] != 1:
            msg = f"{g.id}: staged reductions need rows whose reduced dims come last"
            raise EmitError(msg)
        rows, length = layout[0], layout[1]
        index = "long long" if numel(in_shape) >= 2**31 else "int"
        args = _Args(ir)
        env: dict[str, str] = {}  # per-row values, every stage's
        passes = []
        for n, stage in enumerate(stages(g)):
            if n:
                self._alias_row_values(stage, env)
            passes.append(self._stage(stage, f"acc{n}", in_shape, length, env, args))
        out = ir.node(g.output)
        inside, candidates = set(g.members), self.stored_beside(g.members, out)
        users = self._users or ir.users()
        beside = [  # read past the kernel, a view's readers in its place
            m for m in candidates if readers_past_views(ir, [m.name], users, is_view(ir)) - inside
        ]
        if any(numel(m.shape) != rows or m.name not in env for m in beside):
            msg = f"{g.id}: results stored beside staged reductions are one value a row"
            raise EmitError(msg)
        stores = [f"{args.store(Ref('node', m.name))}[r] = {env[m.name]};" for m in beside]
        threads = _row_threads(math.ceil(length / 4), rows)  # four elements a thread or more
        block = max(threads, 256) if threads <= 32 else threads
        per_block = block // threads
        otype = _CTYPE.get(out.dtype, "float")

        def row_loop(acc: str, name: str, pre: list[str], value: str) -> list[str]:
            return [
                f"    {acc} {name} = {acc}::init();",
                "    #pragma unroll 4",
                f"    for ({index} k = t; k < {length}; k += {threads}) {{",
                f"      const {index} i = r * {length} + k;",
                *(f"      {line}" for line in pre),
                f"      {name}.update({value}, k);",
                "    }",
                *([f"    {_row_combine(threads, name)}"] if threads > 1 else []),
            ]

        ops = ", then ".join("/".join(ir.node(a).op for a in s.anchors) for s in stages(g))
        src = [
            f"// {ops} over the last {length} element(s) of {rows} row(s), {threads} thread(s) "
            f"a row: the row read once a stage, after the first from cache where it fits",
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}('
            f"{args.signature([f'{otype}* __restrict__ out'])}) {{",
            f"  const int t = threadIdx.x % {threads};",
            f"  for ({index} rb = ({index})blockIdx.x * {per_block}; rb < {rows}; "
            f"rb += ({index})gridDim.x * {per_block}) {{",
            f"    const bool live = rb + threadIdx.x / {threads} < {rows};",
            # a lane past the last row reduces that row again, unstored: every load in bounds
            f"    const {index} r = live ? rb + threadIdx.x / {threads} : {rows - 1};",
            *(line for n, (loads, acc, finish) in enumerate(passes[:-1]) for line in [
                *row_loop(acc, f"acc{n}", *loads), *(f"    {x}" for x in finish)
            ]),
            *row_loop(passes[-1][1], f"acc{len(passes) - 1}", *passes[-1][0]),
            "    if (t == 0 && live) {",
            *(f"      {line}" for line in [*passes[-1][2], *stores]),
            f"      out[r] = {env[out.name]};",
            "    }",
            "  }",
            "}",
        ]
        grid = max(1, min(math.ceil(rows / per_block), _MAX_GRID if threads <= 32 else 65535))
        allocs = [
            f"{m.name} = torch.empty({list(m.shape)}, device=_dev, "
            f"dtype={_TORCH_DTYPE.get(m.dtype, 'torch.float32')})"
            for m in beside
        ]
        return [*allocs, *self._add_kernel(src, kernel, grid, block, args, out)]

    def _stage(
        self,
        g: Group,
        acc_name: str,
        in_shape: tuple[int, ...],
        length: int,
        env: dict[str, str],
        args: _Args,
    ) -> tuple[tuple[list[str], str], str, list[str]]:
        """One stage's ``(loads, value)``, accumulator type, and the lines that finish it per
        row (its results and its epilogue, bound in ``env``)."""
        ir = self.ir
        anchors = [ir.node(a) for a in g.anchors]
        acc, vtype, fields = _accumulator(anchors, ir.dtypes)
        loaded = dict(env)
        pre = self.exprs(g.prologue, in_shape, "i", loaded, args)
        values = []
        for n, a in enumerate(anchors):
            value = self.value_of(a.args["input"], in_shape, "i", loaded, args)
            if a.op == "norm":
                pre.append(f"const float sq{n} = {value} * {value};")
                value = f"sq{n}"
            values.append(value)
        value = values[0] if len(values) == 1 else f"make_{vtype}({', '.join(values)})"
        finish = []
        for a, field in zip(anchors, fields, strict=True):
            ctype = _CTYPE.get(a.dtype, "float")
            result = _reduced(a.op, a.args, f"{acc_name}{field}", length)
            finish.append(f"const {ctype} v_{a.name} = ({ctype})({result});")
            env[a.name] = f"v_{a.name}"
        finish += self.exprs(g.epilogue, anchors[0].shape, "r", env, args)
        return (pre, value), acc, finish

    def _alias_row_values(self, g: Group, env: dict[str, str]) -> None:
        """Views the second stage reads of the first's results read the value in registers."""
        ir = self.ir
        for name in [*g.prologue, *g.epilogue]:
            for ref in ir.node(name).tensor_refs():
                if ref.kind != "node" or ref.name in env:
                    continue
                source = row_value_source(ir, ref.name, is_view(ir))
                if source is not None and source in env:
                    env[ref.name] = env[source]

