"""Rubric criteria respond to the signals they are meant to reward."""

from __future__ import annotations

import pytest

from stitch_graph.artifacts import (
    Candidate,
    CompileResult,
    FeedbackItem,
    HackFinding,
    KernelResources,
)
from stitch_graph.checks import HackReport
from stitch_graph.reward import (
    RubricScores,
    launch_configs,
    score_coverage,
    score_cuda_engineering,
    score_rubric,
    score_skill_compliance,
)

PLAIN = """
extern "C" __global__ void add_relu(const float* x, const float* b, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = fmaxf(x[i] + b[i], 0.f);
}
"""

TUNED = """
extern "C" __global__ void __launch_bounds__(256) add_relu(
        const float4* __restrict__ x, const float4* __restrict__ b, float4* __restrict__ out,
        int n4) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += blockDim.x * gridDim.x) {
        float4 v = __ldg(&x[i]);
        float4 w = __ldg(&b[i]);
        v.x = fmaxf(v.x + w.x, 0.f); v.y = fmaxf(v.y + w.y, 0.f);
        v.z = fmaxf(v.z + w.z, 0.f); v.w = fmaxf(v.w + w.w, 0.f);
        out[i] = v;
    }
}
"""

REDUCE = """
extern "C" __global__ void row_sum(const float* __restrict__ x, float* __restrict__ out, int n) {
    __shared__ float partial[32];
    float acc = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc += x[blockIdx.x * n + i];
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffff, acc, o);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = acc;
    __syncthreads();
    if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}
"""


def _host(block: str = "256") -> str:
    return (
        "import torch\n"
        "class ModelNew(torch.nn.Module):\n"
        "    def forward(self, x, b):\n"
        "        out = torch.empty_like(x)\n"
        f"        KERNELS.add_relu(64, {block}, x, b, out, x.numel())\n"
        "        return out\n"
    )


def _cand(kernel: str, block: str = "256", **kwargs: object) -> Candidate:
    return Candidate(kernel_source=kernel, host_source=_host(block), **kwargs)


def test_rubric_mean() -> None:
    scores = RubricScores(anti_hacking=1, cuda_engineering=0, coverage=0.5, skill_compliance=0.5)
    assert scores.mean == pytest.approx(0.5)
    with pytest.raises(ValueError):
        RubricScores(anti_hacking=2, cuda_engineering=0, coverage=0, skill_compliance=0)


def test_anti_hacking() -> None:
    kwargs = {"covered_ops": ["add"], "reference_ops": ["add"]}
    hacked = HackReport(findings=[HackFinding(rule="torch_compute", detail="x")])
    assert score_rubric(_cand(PLAIN), hack_report=hacked, **kwargs).anti_hacking == 0.0
    assert score_rubric(_cand(PLAIN), hack_report=HackReport(), **kwargs).anti_hacking == 1.0
    declared = HackReport(declared_uses=["conv2d"])
    assert 0.5 <= score_rubric(_cand(PLAIN), hack_report=declared, **kwargs).anti_hacking < 1.0


def test_engineering_rewards_technique_and_hygiene() -> None:
    plain, _ = score_cuda_engineering(_cand(PLAIN))
    tuned, notes = score_cuda_engineering(_cand(TUNED))
    reduce, _ = score_cuda_engineering(_cand(REDUCE))
    assert plain < tuned
    assert plain < reduce
    # full hygiene, one of the two techniques that earn the technique half in full
    assert tuned == pytest.approx(0.75), notes
    with_smem = TUNED + "\n__device__ void stage() { __shared__ float pad[32]; }\n"
    both, _ = score_cuda_engineering(_cand(with_smem))
    assert both == pytest.approx(1.0)


def test_engineering_penalises_spills_bad_blocks_and_failed_builds() -> None:
    clean = CompileResult(ok=True, resources=[KernelResources(kernel="add_relu")])
    spilled = CompileResult(
        ok=True, resources=[KernelResources(kernel="add_relu", spill_stores_bytes=64)]
    )
    good, _ = score_cuda_engineering(_cand(TUNED), clean)
    bad, notes = score_cuda_engineering(_cand(TUNED), spilled)
    assert bad < good
    assert any("spill" in n for n in notes)
    odd_block, _ = score_cuda_engineering(_cand(PLAIN.replace("fmaxf", "fmaxf"), block="100"))
    assert odd_block < score_cuda_engineering(_cand(PLAIN))[0]
    assert score_cuda_engineering(_cand(TUNED), CompileResult(ok=False))[0] == 0.0


def test_engineering_counts_vendor_libraries() -> None:
    with_lib, _ = score_cuda_engineering(_cand(PLAIN, link_libraries=["cublasLt"]))
    assert with_lib > score_cuda_engineering(_cand(PLAIN))[0]


def test_coverage() -> None:
    assert score_coverage(["add", "relu"], ["add", "relu"])[0] == 1.0
    assert score_coverage(["relu"], ["aten.convolution", "relu"])[0] == pytest.approx(0.5)
    assert score_coverage(["conv2d", "relu"], ["aten.convolution", "relu"])[0] == 1.0
    declared, notes = score_coverage(["conv2d", "relu"], ["conv2d", "relu"], ["conv2d"])
    assert declared == pytest.approx(0.5)
    assert notes
    assert score_coverage([], [])[0] == 1.0


def test_skill_compliance() -> None:
    before = _cand(PLAIN)
    vectorise = [FeedbackItem(action="vectorize loads", detail="use float4")]
    assert score_skill_compliance(_cand(TUNED), feedback_items=vectorise, previous=before)[0] == 1
    assert score_skill_compliance(_cand(PLAIN), feedback_items=vectorise, previous=before)[0] == 0

    block = [FeedbackItem(action="change block size", detail="try 128 threads per block")]
    changed = _cand(PLAIN, block="128")
    assert score_skill_compliance(changed, feedback_items=block, previous=before)[0] == 1
    assert score_skill_compliance(before, feedback_items=block, previous=before)[0] == 0

    both = vectorise + block
    score, notes = score_skill_compliance(changed, feedback_items=both, previous=before)
    assert score == pytest.approx(0.5)
    assert "vectorize loads" in notes[0]

    assert score_skill_compliance(before, feedback_items=None)[0] == 1.0


def test_skill_compliance_for_hack_feedback() -> None:
    before = _cand(PLAIN)
    items = [FeedbackItem(action="remove torch_compute", detail="F.relu", source="hack-check")]
    clean = _cand(TUNED)
    assert score_skill_compliance(clean, feedback_items=items, previous=before)[0] == 1
    still = HackReport(findings=[HackFinding(rule="torch_compute", detail="x")])
    assert (
        score_skill_compliance(clean, feedback_items=items, previous=before, hack_report=still)[0]
        == 0
    )


def test_launch_configs() -> None:
    host = (
        "BLOCK = 128\n"
        "def f(x):\n"
        "    KERNELS.a(1, 256, x)\n"
        "    KERNELS.b(1, (16, 16), x)\n"
        "    KERNELS.c(1, BLOCK, x)\n"
        "    KERNELS.d(1, some_runtime_value, x)\n"
    )
    assert launch_configs(host) == [(256,), (16, 16), (128,)]
    assert launch_configs("not python (") == []
