"""Fused attention (``_fusion_attention``): one block a tile of queries of one batch entry,
walking the keys in tiles of 32 through shared memory, scores and probabilities in registers.

Each thread holds 4 query rows by 4 keys of a tile's scores (keys ``tx + 8 b``, so the lanes
of a warp read eight different key rows of shared memory without a bank conflict) and, for the
same 4 rows, its columns of the output. The scores' pointwise chain (scale, mask, bias) runs on
them where they are computed; the softmax is online (a running maximum and sum a row, the
eight lanes sharing a row reduced by shuffles). A tile that a mask hides from every query of
the block (a causal mask's upper triangle) is skipped before its scores are computed.

``_AttentionEmitter`` is a mixin of ``emit._Emitter``.
"""

from __future__ import annotations

import math

from stitch_graph.codegen._emit_base import (
    _SMS,
    EmitError,
    _Args,
    _EmitterBase,
    _literal,
    _offset,
)
from stitch_graph.codegen._fusion_attention import (
    Attention,
    feeding,
    find,
    hiding_fill,
    whole_view_base,
)
from stitch_graph.codegen.ir import Group, Ref, numel
from stitch_graph.codegen.tuning import KernelTuning

_KEYS = 32  # keys a tile
_LANES = _KEYS // 4  # threads sharing a query row
_LD_P = _KEYS + 4  # row pitch of the probability tile
_SHARED_FLOATS = 12 * 1024  # 48 KB of static shared memory
_BLOCKS_AN_SM = 4  # blocks of 64 rows (128 threads of 128 registers) an SM holds
_TILE_LOADS = 32  # a block's key and value tile loads, in rows of work


def _pad4(n: int) -> int:
    return (n + 3) // 4 * 4


def _tiles(
    head: int, dv: int, lq: int, blocks: int, tun: KernelTuning
) -> tuple[int, int, int, int, int, bool]:
    """Query rows a block, the row pitches of the q, k, v and probability tiles, the v
    columns the lanes cover, and whether k and v have a tile each (loaded together, two
    barriers a key tile) or share one (four barriers; where two do not fit in shared memory).
    The rows are the tuning's ``rows_per_block`` where they fit. Else the most that fit, where
    their blocks (``blocks`` batch entries times the sequence's tiles) run in one wave: a
    thread's share of each key tile's loads shrinks with more rows while its arithmetic stays
    the same, and a block of 16 rows is one warp waiting on its loads. Over more waves, the
    count with the least work: the rows computed (idle ones in a sequence's last block
    included), each block's key tiles counted as ``_TILE_LOADS`` more rows."""
    cols = math.ceil(dv / (4 * _LANES)) * 4 * _LANES  # v columns the lanes cover, 4 each
    ld_q, ld_k, ld_v = _pad4(head) + 4, _pad4(head) + 4, cols + 4

    def split(rows: int) -> bool | None:
        """Whether k and v get a tile each at ``rows`` (None: not even one shared fits)."""
        kept = rows * ld_q + rows * _LD_P
        if kept + _KEYS * (ld_k + ld_v) <= _SHARED_FLOATS:
            return True
        if kept + _KEYS * max(ld_k, ld_v) <= _SHARED_FLOATS:
            return False
        return None

    fits = [rows for rows in (64, 32, 16) if split(rows) is not None]
    if not fits:
        msg = f"attention rows of {head} and {dv} do not fit 16 queries in shared memory"
        raise EmitError(msg)
    if tun.rows_per_block in fits:
        rows = tun.rows_per_block
    elif blocks * math.ceil(lq / fits[0]) <= _SMS * _BLOCKS_AN_SM:
        rows = fits[0]
    else:
        rows = min(fits, key=lambda r: (math.ceil(lq / r) * (r + _TILE_LOADS), -r))
    if split(rows):
        return rows, ld_q, ld_k, ld_v, cols, True
    return rows, ld_q, max(ld_k, ld_v), max(ld_k, ld_v), cols, False


def _extent(shape: tuple[int, ...], strides: tuple[int, ...]) -> int:
    return 1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))


def _each_score(
    ix: str, shape: tuple[int, ...], inside: list[str], before: str = "", after: str = ""
) -> list[str]:
    """A loop over the thread's 4 x 4 scores of the tile (``s[a][b]``, query ``qq``, key
    ``kk``): ``inside`` where the element lies in the scores (its row ``r`` and index ``i``
    bound, for the operands' loads), ``before`` and ``after`` around that test."""
    lq, lk = shape[-2:]
    return [
        "#pragma unroll",
        "for (int a = 0; a < 4; ++a) {",
        "#pragma unroll",
        "  for (int b = 0; b < 4; ++b) {",
        f"    const {ix} qq = q0 + ty * 4 + a, kk = k0 + tx + {_LANES} * b;",
        *([f"    {before}"] if before else []),
        f"    if (qq < {lq} && kk < {lk}) {{",
        f"      const {ix} r = bidx * {lq} + qq;",
        f"      const {ix} i = r * {lk} + kk;",
        *(f"      {line}" for line in inside),
        "    }",
        *([f"    {after}"] if after else []),
        "  }",
        "}",
    ]


class _AttentionEmitter(_EmitterBase):
    """The fused attention kernel (``attention``)."""

    def attention(self, g: Group, kernel: str, tun: KernelTuning) -> list[str]:
        ir = self.ir
        found = find(ir, g.members, ir.users())
        if found is None:
            msg = f"{g.id}: its members are not an attention"
            raise EmitError(msg)
        s_node, o_node = ir.node(found.scores), ir.node(found.product)
        q, kt, v = s_node.args["input"], s_node.args["other"], o_node.args["other"]
        shape, out_shape = tuple(s_node.shape), tuple(o_node.shape)
        batch, (lq, lk) = shape[:-2], shape[-2:]
        head, dv = ir.shapes[q][-1], ir.shapes[v][-1]
        rows, ld_q, ld_k, ld_v, cols, split = _tiles(head, dv, lq, numel(batch), tun)
        vbuf = "sv" if split else "sk"
        threads = rows // 4 * _LANES
        blocks_q = math.ceil(lq / rows)
        spans = [numel(shape), numel(out_shape), *(
            _extent(ir.shapes[r], ir.strides[r]) for r in (q, kt, v))]
        ix = "long long" if max(spans) >= 2**31 else "int"
        args = _Args(ir, row=(shape, lk))

        def base(ref: Ref) -> str:
            rshape, rstrides = ir.shapes[ref], ir.strides[ref]
            return _offset(tuple(rshape[:-2]), tuple(rstrides[:-2]), batch, "bidx")

        sq, sk, sv = ir.strides[q], ir.strides[kt], ir.strides[v]
        dp = _pad4(head)
        softmax = found.softmax is not None
        hidden = -math.inf if softmax else 0.0
        q_tile = self._tile(found, q, ("sq", ld_q), (rows, dp, "q0"), (lq, head),
                            (sq[-2], -1, "qoff"), ix, args, threads)
        k_tile = self._tile(found, kt, ("sk", ld_k), (_KEYS, dp, "k0"), (lk, head),
                            (sk[-1], -2, "koff"), ix, args, threads)
        v_tile = self._tile(found, v, (vbuf, ld_v), (_KEYS, cols, "k0"), (lk, dv),
                            (sv[-2], -1, "voff"), ix, args, threads)
        score_lines, score = self._score(found, shape, args)
        mask = self._tile_mask(found, shape, args, ix)
        gate = self._gate(found, shape, args, ix)
        env_out: dict[str, str] = {found.product: "acc"}
        epilogue = self.exprs(found.epilogue, out_shape, "i", env_out, args)
        result = env_out[g.output] if found.epilogue else "acc"
        width = cols // (4 * _LANES)
        src = [
            f'extern "C" __global__ __launch_bounds__({threads}) void {kernel}('
            f"{args.signature(['float* __restrict__ out'])}) {{",
            f"  __shared__ __align__(16) float sq[{rows * ld_q}];",
            f"  __shared__ __align__(16) float sk[{_KEYS * ld_k}];",
            *([f"  __shared__ __align__(16) float sv[{_KEYS * ld_v}];"] if split else []),
            f"  __shared__ __align__(16) float sp[{rows * _LD_P}];",
            f"  const int tid = threadIdx.x, ty = tid / {_LANES}, tx = tid % {_LANES};",
            f"  const {ix} bidx = blockIdx.x / {blocks_q};",
            f"  const {ix} q0 = ({ix})(blockIdx.x % {blocks_q}) * {rows};",
            f"  const {ix} qoff = {base(q)}, koff = {base(kt)}, voff = {base(v)};",
            *(f"  {line}" for line in q_tile),
            "  float m[4], l[4], o[4][" + str(4 * width) + "];",
            "#pragma unroll",
            "  for (int a = 0; a < 4; ++a) {",
            "    m[a] = -SG_INF; l[a] = 0.f;",
            "#pragma unroll",
            f"    for (int c = 0; c < {4 * width}; ++c) o[a][c] = 0.f;",
            "  }",
            f"  for ({ix} k0 = 0; k0 < {lk}; k0 += {_KEYS}) {{",
            *([f"    {line}" for line in mask] if mask else []),
            "    __syncthreads();",
            *(f"    {line}" for line in (*k_tile, *(v_tile if split else []))),
            "    __syncthreads();",
            "    float s[4][4];",
            "#pragma unroll",
            "    for (int a = 0; a < 4; ++a)",
            "#pragma unroll",
            "      for (int b = 0; b < 4; ++b) s[a][b] = 0.f;",
            "#pragma unroll 4",
            f"    for (int d = 0; d < {dp}; d += 4) {{",
            "      float4 qv[4], kv[4];",
            "#pragma unroll",
            "      for (int a = 0; a < 4; ++a)",
            f"        qv[a] = *reinterpret_cast<const float4*>(&sq[(ty * 4 + a) * {ld_q} + d]);",
            "#pragma unroll",
            "      for (int b = 0; b < 4; ++b)",
            f"        kv[b] = *reinterpret_cast<const float4*>(&sk[(tx + {_LANES} * b) * {ld_k}"
            " + d]);",
            "#pragma unroll",
            "      for (int a = 0; a < 4; ++a)",
            "#pragma unroll",
            "        for (int b = 0; b < 4; ++b)",
            "          s[a][b] = fmaf(qv[a].w, kv[b].w, fmaf(qv[a].z, kv[b].z, "
            "fmaf(qv[a].y, kv[b].y, fmaf(qv[a].x, kv[b].x, s[a][b]))));",
            "    }",
            *(f"    {line}" for line in _each_score(
                ix, shape, [*score_lines, f"p = (float)({score});"],
                before=f"float p = {_literal(hidden)};", after="s[a][b] = p;",
            )),
            *(self._online_softmax(width) if softmax else []),
            *gate,
            "#pragma unroll",
            "    for (int a = 0; a < 4; ++a)",
            "#pragma unroll",
            "      for (int b = 0; b < 4; ++b)",
            f"        sp[(ty * 4 + a) * {_LD_P} + tx + {_LANES} * b] = s[a][b];",
            # a warp reads back the probabilities of its own rows only
            *(["    __syncwarp();"] if split else
              ["    __syncthreads();", *(f"    {line}" for line in v_tile), "    __syncthreads();"]),
            "#pragma unroll 2",
            f"    for (int kk = 0; kk < {_KEYS}; kk += 4) {{",
            "      float4 pv[4];",
            "#pragma unroll",
            "      for (int a = 0; a < 4; ++a)",
            f"        pv[a] = *reinterpret_cast<const float4*>(&sp[(ty * 4 + a) * {_LD_P} + kk]);",
            "#pragma unroll",
            "      for (int j = 0; j < 4; ++j) {",
            "#pragma unroll",
            f"        for (int w = 0; w < {width}; ++w) {{",
            "          const float4 vv = *reinterpret_cast<const float4*>("
            f"&{vbuf}[(kk + j) * {ld_v} + tx * 4 + {4 * _LANES} * w]);",
            "#pragma unroll",
            "          for (int a = 0; a < 4; ++a) {",
            "            const float pj = reinterpret_cast<const float*>(&pv[a])[j];",
            "            o[a][w * 4] = fmaf(pj, vv.x, o[a][w * 4]);",
            "            o[a][w * 4 + 1] = fmaf(pj, vv.y, o[a][w * 4 + 1]);",
            "            o[a][w * 4 + 2] = fmaf(pj, vv.z, o[a][w * 4 + 2]);",
            "            o[a][w * 4 + 3] = fmaf(pj, vv.w, o[a][w * 4 + 3]);",
            "          }",
            "        }",
            "      }",
            "    }",
            "  }",
            "#pragma unroll",
            "  for (int a = 0; a < 4; ++a) {",
            f"    const {ix} qq = q0 + ty * 4 + a;",
            f"    if (qq >= {lq}) continue;",
            f"    const float inv = {'1.f / l[a]' if softmax else '1.f'};",
            "#pragma unroll",
            f"    for (int w = 0; w < {width}; ++w) {{",
            "#pragma unroll",
            "      for (int j = 0; j < 4; ++j) {",
            f"        const int col = tx * 4 + {4 * _LANES} * w + j;",
            f"        if (col >= {dv}) continue;",
            f"        const {ix} r = bidx * {lq} + qq;",
            f"        const {ix} i = r * {dv} + col;",
            "        const float acc = o[a][w * 4 + j] * inv;",
            *(f"        {line}" for line in epilogue),
            f"        out[i] = {result};",
            "      }",
            "    }",
            "  }",
            "}",
        ]
        grid = blocks_q * numel(batch)
        return self._add_kernel(src, kernel, grid, threads, args, ir.node(g.output))

    def _tile(
        self,
        found: Attention,
        ref: Ref,
        buffer: tuple[str, int],
        extent: tuple[int, int, str],
        limits: tuple[int, int],
        layout: tuple[int, int, str],
        ix: str,
        args: _Args,
        threads: int,
    ) -> list[str]:
        """The loop that fills shared ``buffer`` (name, row pitch) with ``extent`` (rows,
        columns, first row) of operand ``ref``, zero past ``limits`` (rows, columns); ``layout``
        is the row stride, the axis of ``ref`` the columns run along (-1 or -2) and the batch
        offset. Tile row ``c`` is operand row ``kk``. Where the columns are contiguous and every
        other stride and the column count are multiples of 4, whole float4s are loaded when the
        operand starts on a 16-byte boundary (checked at run time), one element at a time
        otherwise."""
        name, ld = buffer
        count, width, first = extent
        row_limit, col_limit = limits
        row_stride, axis, off = layout
        strides = self.ir.strides[ref]
        offset = f"{off} + kk * {row_stride} + ({ix})d * {strides[axis]}"
        inside = f"kk < {row_limit} && d < {col_limit}"
        scalar = [
            f"for (int e = tid; e < {count * width}; e += {threads}) {{",
            f"  const int c = e / {width}, d = e % {width};",
            f"  const {ix} kk = {first} + c;",
            *self._tile_load(found, ref, f"{name}[c * {ld} + d]", inside, offset, ix, args, "  "),
            "}",
        ]
        base, _ = whole_view_base(self.ir, ref)
        chained = base.kind == "node" and bool(found.operands.get(base.name))
        others = [st for a, st in enumerate(strides) if a != len(strides) + axis]
        if chained or strides[axis] != 1 or col_limit % 4 or any(st % 4 for st in others):
            return scalar
        p = args.param(ref)
        return [
            f"if ((reinterpret_cast<unsigned long long>({p} + {off}) & 15) == 0) {{",
            f"  for (int e = tid; e < {count * width // 4}; e += {threads}) {{",
            f"    const int c = e / {width // 4}, d = e % {width // 4} * 4;",
            f"    const {ix} kk = {first} + c;",
            "    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);",
            f"    if ({inside}) x = *reinterpret_cast<const float4*>(&{p}[{offset}]);",
            f"    *reinterpret_cast<float4*>(&{name}[c * {ld} + d]) = x;",
            "  }",
            "} else {",
            *(f"  {line}" for line in scalar),
            "}",
        ]

    def _tile_load(
        self,
        found: Attention,
        ref: Ref,
        slot: str,
        inside: str,
        offset: str,
        ix: str,
        args: _Args,
        indent: str,
    ) -> list[str]:
        """Lines storing into ``slot`` the element of operand ``ref`` at ``offset`` (0 where
        ``inside`` is false): a load, or, for an operand a pointwise chain of the group
        computes, that chain at the element (the offset into the viewed value, which is
        contiguous, is its index)."""
        base, _ = whole_view_base(self.ir, ref)
        chain = found.operands.get(base.name) if base.kind == "node" else None
        if not chain:
            return [f"{indent}{slot} = ({inside}) ? {args.param(ref)}[{offset}] : 0.f;"]
        env: dict[str, str] = {}
        lines = self.exprs(chain, tuple(self.ir.shapes[base]), "xi", env, args)
        return [
            f"{indent}{{",
            f"{indent}  float x = 0.f;",
            f"{indent}  if ({inside}) {{",
            f"{indent}    const {ix} xi = {offset};",
            *(f"{indent}    {line}" for line in lines),
            f"{indent}    x = {env[base.name]};",
            f"{indent}  }}",
            f"{indent}  {slot} = x;",
            f"{indent}}}",
        ]

    def _score(self, found: Attention, shape: tuple[int, ...], args: _Args) -> tuple[list[str], str]:
        """The chain's lines at score element ``i`` (row ``r``), the score held in
        ``s[a][b]``, and the value the softmax (or the product) takes."""
        env = {found.scores: "s[a][b]"}
        lines = self.exprs(found.chain, shape, "i", env, args)
        if found.softmax is not None:
            taken = self.ir.node(found.softmax).args["input"]
        else:
            taken = self.ir.node(found.product).args["input"]
        return lines, env[taken.name]

    def _gate(self, found: Attention, shape: tuple[int, ...], args: _Args, ix: str) -> list[str]:
        """Lines multiplying each unnormalised probability of the tile by the gate's factors
        (computed again at the element where the chain computes them), empty without a gate."""
        if not found.gate:
            return []
        factors = {
            r.name for m in found.gate for r in self.ir.node(m).tensor_refs()
            if r.kind == "node" and r.name in found.chain
        }
        needed = {m for f in factors for m in feeding(self.ir, found.chain, f)}
        env = {found.softmax or "": "s[a][b]"}
        computed = [m for m in found.chain if m in needed]
        lines = self.exprs([*computed, *found.gate], shape, "i", env, args)
        inside = [*lines, f"s[a][b] = {env[found.gate[-1]]};"]
        return [f"    {line}" for line in _each_score(ix, shape, inside)]

    def _tile_mask(
        self, found: Attention, shape: tuple[int, ...], args: _Args, ix: str
    ) -> list[str]:
        """Lines that skip a key tile (``continue``) when a mask hides every score of it from
        every query of the block: the softmax's input is ``masked_fill(x, mask, -inf)`` (a ReLU
        of it, or a fill with 0, without a softmax) with a mask that does not read the scores.
        Empty where there is no such mask."""
        hiding = hiding_fill(self.ir, found)
        if hiding is None:
            return []
        node = self.ir.node(hiding)
        mask = node.args["mask"]
        env: dict[str, str] = {}
        if mask.kind == "node" and mask.name in found.chain:
            computed = feeding(self.ir, found.chain, mask.name)
            lines = self.exprs(computed, shape, "i", env, args)
            value = env[mask.name]
        else:
            lines = []
            value = args.load(mask, shape, "i", node.attrs.get("bshape", {}).get("mask"))
        return [
            "bool live = false;",
            *_each_score(ix, shape, [*lines, f"live = live || !({value});"]),
            "if (!__syncthreads_or(live)) continue;",
        ]

    @staticmethod
    def _online_softmax(width: int) -> list[str]:
        """The running maximum and sum of each of the thread's rows updated with this tile, the
        output rescaled, the tile's probabilities left in ``s``."""
        shuffle = [f"      x = {op}(x, __shfl_xor_sync(SG_FULL, x, {k}));"
                   for op in ("fmaxf",) for k in (4, 2, 1)]
        return [
            "#pragma unroll",
            "    for (int a = 0; a < 4; ++a) {",
            "      float x = fmaxf(fmaxf(s[a][0], s[a][1]), fmaxf(s[a][2], s[a][3]));",
            *shuffle,
            "      const float top = fmaxf(m[a], x);",
            "      const float base = top == -SG_INF ? 0.f : top;",
            "      const float keep = __expf(m[a] - base);",
            "      float sum = 0.f;",
            "#pragma unroll",
            "      for (int b = 0; b < 4; ++b) {",
            "        s[a][b] = __expf(s[a][b] - base);",
            "        sum += s[a][b];",
            "      }",
            *(f"      sum += __shfl_xor_sync(SG_FULL, sum, {k});" for k in (4, 2, 1)),
            "      l[a] = l[a] * keep + sum;",
            "      m[a] = top;",
            "#pragma unroll",
            f"      for (int c = 0; c < {4 * width}; ++c) o[a][c] *= keep;",
            "    }",
        ]
