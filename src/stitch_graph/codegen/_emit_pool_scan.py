"""Pooling (max, average, adaptive) and scans (cumsum/cumprod): ops whose output element reads a
run of its input, a window or a prefix of a line.

Pooling is a pointwise kernel whose anchor value loops over the window; scans use a thread per
line or a warp per line (shuffle scan plus carry). ``_PoolScanEmitter`` is a mixin of
``emit._Emitter``.
"""

from __future__ import annotations

import math
from typing import Any

from stitch_graph.codegen._emit_base import _CTYPE, _MAX_GRID, _Args, _EmitterBase, _literal
from stitch_graph.codegen.ir import Group, Ref, numel, row_layout
from stitch_graph.codegen.schedule import pool_dims
from stitch_graph.codegen.tuning import KernelTuning


class _PoolScanEmitter(_EmitterBase):
    """Pooling (``pool``) and scan (``scan``) kernels."""

    # ---- pooling -------------------------------------------------------------------------------
    def pool(self, g: Group, kernel: str, tun: KernelTuning) -> list[str]:
        """Max/average pooling (fixed or adaptive windows) over the last 1-3 dims.

        A grid-stride pointwise kernel over the output whose anchor value loops over the window:
        one thread per output, the pointwise prologue evaluated on each window element and the
        epilogue on the pooled value. Window bounds follow PyTorch: padding is skipped (max) or
        counted as ``count_include_pad`` says (average, divisor from the window clipped to the
        padded input); adaptive windows are ``[floor(o*I/O), ceil((o+1)*I/O))``.
        """
        ir = self.ir
        node = ir.node(g.anchor or "")
        op = node.op
        nd = pool_dims(node)
        x: Ref = node.args["input"]
        xs, os_ = ir.shapes[x], tuple(node.shape)
        isp, osp = xs[-nd:], os_[-nd:]
        in_sp, out_sp = numel(isp), numel(osp)
        it = "long long" if numel(xs) >= 2**31 else "int"
        adaptive = op.startswith("adaptive")
        is_max = "max" in op

        def per_dim(key: str, default: Any) -> list[int]:
            value = node.args.get(key)
            if value is None or (isinstance(value, list | tuple) and not value):
                value = default
            values = [int(v) for v in value] if isinstance(value, list | tuple) else [int(value)]
            return values * nd if len(values) == 1 else values

        if not adaptive:
            ks = per_dim("kernel_size", 1)
            st = per_dim("stride", ks)
            pad = per_dim("padding", 0)
            dil = per_dim("dilation", 1) if is_max else [1] * nd

        def inside(j: int) -> bool:
            """Whether every window of dim ``j`` lies in the input (no padding reached)."""
            if adaptive:
                return False
            last = (osp[j] - 1) * st[j] - pad[j] + (ks[j] - 1) * dil[j]
            return pad[j] == 0 and last < isp[j]

        def anchor_line(args: _Args, idx: str) -> tuple[str, str]:
            loads = _Args(ir, refs=args.refs)  # window elements: scalar loads, never float4
            env: dict[str, str] = {}
            pre = self.exprs(g.prologue, xs, "ii", env, loads)
            value = self.value_of(x, xs, "ii", env, loads)
            lines = [f"const {it} base = ({it})({idx} / {out_sp}) * {in_sp};"]
            for j in range(nd):
                inner = numel(osp[j + 1 :])
                coord = f"({idx} / {inner})" if inner > 1 else idx
                lines.append(f"const int o{j} = (int)({coord} % {osp[j]});")
            loops: list[str] = []
            count: list[str] = []
            size: list[str] = []
            for j in range(nd):
                i_j, o_j = isp[j], osp[j]
                if adaptive:
                    lines += [
                        f"const int s{j} = (int)(((long long)o{j} * {i_j}) / {o_j});",
                        f"const int e{j} = (int)(((long long)(o{j} + 1) * {i_j} + {o_j - 1}) / {o_j});",  # noqa: E501
                    ]
                    loops.append(f"for (int c{j} = s{j}; c{j} < e{j}; ++c{j}) {{")
                    count.append(f"(e{j} - s{j})")
                elif is_max or inside(j):
                    # a window that never leaves the input needs no bounds: a fixed trip count,
                    # unrolled innermost, so a thread has its window's loads in flight at once
                    loops += [
                        *(["#pragma unroll"] if j == nd - 1 else []),
                        f"for (int w{j} = 0; w{j} < {ks[j]}; ++w{j}) {{",
                        f"const int c{j} = o{j} * {st[j]} - {pad[j]} + w{j} * {dil[j]};",
                        *([] if inside(j) else [f"if (c{j} < 0 || c{j} >= {i_j}) continue;"]),
                    ]
                    count.append(str(ks[j]))
                    size.append(str(ks[j]))
                else:
                    lines += [
                        f"int s{j} = o{j} * {st[j]} - {pad[j]};",
                        f"int e{j} = min(s{j} + {ks[j]}, {i_j + pad[j]});",
                        f"const int n{j} = e{j} - s{j};",
                        f"s{j} = max(s{j}, 0);",
                        f"e{j} = min(e{j}, {i_j});",
                    ]
                    # the window's fixed count, unrolled innermost, the clipped part skipped
                    loops += [
                        *(["#pragma unroll"] if j == nd - 1 else []),
                        f"for (int w{j} = 0; w{j} < {ks[j]}; ++w{j}) {{",
                        f"const int c{j} = o{j} * {st[j]} - {pad[j]} + w{j};",
                        f"if (c{j} < s{j} || c{j} >= e{j}) continue;",
                    ]
                    count.append(f"(e{j} - s{j})")
                    size.append(f"n{j}")
            offset = "c0"
            for j in range(1, nd):
                offset = f"({offset}) * {isp[j]} + c{j}"
            update = "acc = (v > acc || v != v) ? v : acc;" if is_max else "acc += v;"
            body = [f"const {it} ii = base + {offset};", *pre, f"const float v = {value};", update]
            if is_max:
                result = "acc"
            else:
                divisor = node.args.get("divisor_override")
                if divisor:
                    div = _literal(float(divisor))
                elif adaptive or not node.args.get("count_include_pad", True):
                    div = f"(float)({' * '.join(count)})"
                else:
                    div = f"(float)({' * '.join(size)})"
                result = f"acc / {div}"
            init = "-SG_INF" if is_max else "0.f"
            nested: list[str] = []
            depth = 0
            for line in loops:
                nested.append("  " * depth + line)
                depth += line.endswith("{")
            nested += ["  " * depth + line for line in body]
            code = [
                f"float v_{node.name};",
                "{",
                *(f"  {line}" for line in lines),
                f"  float acc = {init};",
                *(f"  {line}" for line in nested),
                "  " + "}" * depth,
                f"  v_{node.name} = {result};",
                "}",
            ]
            return node.name, "\n    ".join(code)

        out = ir.node(g.output)
        # one output a thread: a window's loads are scalar, and four outputs a thread spread a
        # warp's loads four times wider (KernelBench L1 1-D average pooling, H200: 2.32 ms with
        # four, 1.96 ms with one)
        scalar = tun.model_copy(update={"vector_width": 1})
        return self.pointwise(g.id, kernel, g.epilogue, out, scalar, anchor_line)

    # ---- scans ---------------------------------------------------------------------------------
    def scan(self, g: Group, kernel: str, tun: KernelTuning) -> list[str]:
        """Inclusive cumulative sum/product along one dim, prologue on load, epilogue on store.

        Lines whose elements are ``inner`` apart with ``inner >= 32`` (a non-last dim): one thread
        per line, neighbouring threads on neighbouring lines (coalesced). Contiguous lines: one
        warp per line, 32 elements at a time with a ``__shfl_up_sync`` scan and a carry
        (``tun.rows_per_block == 1`` forces the thread-per-line kernel).
        """
        ir = self.ir
        node = ir.node(g.anchor or "")
        x: Ref = node.args["input"]
        xs = ir.shapes[x]
        dim = int(node.args["dim"]) % max(len(xs), 1)
        outer, length, inner = row_layout(xs, [dim]) if xs else (1, 1, 1)
        lines_n = outer * inner
        out = ir.node(g.output)
        big = numel(xs) >= 2**31
        index = "long long" if big else "int"
        is_sum = node.op == "cumsum"
        ident, combine = ("0.f", "+") if is_sum else ("1.f", "*")
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
        base = f"(r / {inner}) * {length * inner} + r % {inner}" if inner > 1 else f"r * {length}"
        if not warp:
            src = [
                f"// {node.op} along {length} element(s) of {lines_n} line(s), thread per line",
                f'extern "C" __global__ __launch_bounds__({block}) void {kernel}('
                f"{args.signature([f'{otype}* __restrict__ out'])}) {{",
                f"  for ({index} r = ({index})blockIdx.x * {block} + threadIdx.x; r < {lines_n}; "
                f"r += ({index})gridDim.x * {block}) {{",
                f"    const {index} b = {base};",
                f"    float run = {ident};",
                f"    for ({index} k = 0; k < {length}; ++k) {{",
                f"      const {index} i = b + k * {inner};",
                *(f"      {line}" for line in pre),
                f"      run = run {combine} {value};",
                f"      const float v_{node.name} = run;",
                *(f"      {line}" for line in post),
                f"      out[i] = {result};",
                "    }",
                "  }",
                "}",
            ]
            grid = max(1, min(math.ceil(lines_n / block), _MAX_GRID))
            return self._add_kernel(src, kernel, grid, block, args, out)
        warps = block // 32
        src = [
            f"// {node.op} along {length} element(s) of {lines_n} line(s), warp per line: "
            "32 elements a step, shuffle scan plus carry",
            f'extern "C" __global__ __launch_bounds__({block}) void {kernel}('
            f"{args.signature([f'{otype}* __restrict__ out'])}) {{",
            "  const int lane = threadIdx.x & 31;",
            f"  for ({index} r = ({index})blockIdx.x * {warps} + (threadIdx.x >> 5); r < {lines_n}; "
            f"r += ({index})gridDim.x * {warps}) {{",
            f"    const {index} b = {base};",
            f"    float carry = {ident};",
            f"    for ({index} k0 = 0; k0 < {length}; k0 += 32) {{",
            f"      const {index} k = k0 + lane;",
            f"      const {index} i = b + (k < {length} ? k : 0);",
            f"      float run = {ident};",
            f"      if (k < {length}) {{",
            *(f"        {line}" for line in pre),
            f"        run = {value};",
            "      }",
            "#pragma unroll",
            "      for (int o = 1; o < 32; o <<= 1) {",
            "        const float y = __shfl_up_sync(SG_FULL, run, o);",
            f"        if (lane >= o) run = y {combine} run;",
            "      }",
            f"      run = carry {combine} run;",
            "      carry = __shfl_sync(SG_FULL, run, 31);",
            f"      if (k < {length}) {{",
            f"        const float v_{node.name} = run;",
            *(f"        {line}" for line in post),
            f"        out[i] = {result};",
            "      }",
            "    }",
            "  }",
            "}",
        ]
        grid = max(1, min(math.ceil(lines_n / warps), _MAX_GRID))
        return self._add_kernel(src, kernel, grid, block, args, out)
