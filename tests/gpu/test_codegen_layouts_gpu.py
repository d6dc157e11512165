"""Generated programs on a real GPU for the layouts the CPU emulation checks: concatenations
written in place by cuDNN epilogues and scans, batch norm over (N, C) in column tiles,
repeated layers sharing one kernel, activations computed with ``__expf``/``__logf`` (whose
accuracy the CPU emulation cannot show), sorts, scatters, and a forward that branches on a
value. Each matches PyTorch at 1e-4 (TF32 off) on three draws."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

_FIRE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.squeeze = nn.Conv2d(16, 6, 1)
        self.e1 = nn.Conv2d(6, 12, 1)
        self.e3 = nn.Conv2d(6, 20, 3, padding=1)

    def forward(self, x):
        s = torch.relu(self.squeeze(x))
        return torch.cat([torch.relu(self.e1(s)), torch.relu(self.e3(s))], 1)


def get_inputs():
    return [torch.randn(4, 16, 30, 33)]


def get_init_inputs():
    return []
"""

_CUMSUM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        head = torch.zeros_like(x.select(1, 0).unsqueeze(1))
        return torch.cat((head, torch.cumsum(x.narrow(1, 0, x.size(1) - 1), dim=1)), dim=1)


def get_inputs():
    return [torch.rand(300, 1000)]


def get_init_inputs():
    return []
"""

_GEMM_BN = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.gemm = nn.Linear(256, 300)
        self.bn = nn.BatchNorm1d(300)

    def forward(self, x):
        return torch.relu(self.bn(self.gemm(x) * 0.5))


def get_inputs():
    return [torch.randn(3000, 256)]


def get_init_inputs():
    return []
"""

_REPEATED = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.GELU()) for _ in range(6)])

    def forward(self, x):
        return self.layers(x)


def get_inputs():
    return [torch.randn(128, 64)]


def get_init_inputs():
    return []
"""

_ACTIVATIONS = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, x):
        return torch.stack([F.softplus(x), F.softplus(x, beta=2.0, threshold=5.0), F.mish(x),
                            torch.sigmoid(x), F.silu(x), F.logsigmoid(x)])


def get_inputs():
    return [torch.randn(64, 4099) * 12]  # far into both tails, where the fast forms differ most


def get_init_inputs():
    return []
"""

_ROW_EXPONENTIALS = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, t):
        return torch.cat([torch.softmax(x, -1), torch.log_softmax(x, -1),
                          torch.logsumexp(x / t, -1, keepdim=True)], -1)


def get_inputs():
    # rows spread far below their maxima, where an approximate exp differs most
    return [torch.randn(256, 4099) * 30, torch.rand(256, 1) + 0.05]


def get_init_inputs():
    return []
"""

_LABEL_SMOOTHING = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, logits, target):
        logp = F.log_softmax(logits, dim=-1)
        nll = -logp.gather(-1, target[:, None]).squeeze(1)
        return (0.9 * nll - 0.1 * logp.mean(-1)).mean()


def get_inputs():
    return [torch.randn(1024, 32000), torch.randint(0, 32000, (1024,))]


def get_init_inputs():
    return []
"""

_ORDER = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        top = torch.topk(x, 8, dim=-1).values
        return torch.cat([top, torch.median(x, dim=-1, keepdim=True).values,
                          torch.quantile(x, 0.9, dim=-1, keepdim=True)], dim=-1)


def get_inputs():
    return [torch.randn(4096, 3000)]  # 4096 lines of 3000 keys, padded to 4096


def get_init_inputs():
    return []
"""

_ARGSORT = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        # a router's choice: each row's top 4 of 64 experts, their indices and weights
        top = torch.topk(x, 4, dim=-1)
        return torch.cat([top.indices.float(), torch.softmax(top.values, dim=-1),
                          torch.argsort(x, dim=-1, descending=True).float()], dim=-1)


def get_inputs():
    return [torch.randn(32768, 64)]


def get_init_inputs():
    return []
"""

_SCATTER = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, src, ids):
        # 65536 rows added into 512 (a MoE combine or a graph's messages), then one more scatter
        pooled = torch.zeros_like(x).index_add(0, ids, src)
        return x.scatter_add(1, (src[:512].abs() * 40).long().clamp(max=255), src[:512]) + pooled


def get_inputs():
    return [torch.randn(512, 256), torch.randn(65536, 256), torch.randint(0, 512, (65536,))]


def get_init_inputs():
    return []
"""

_GUARDED = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, x, y):
        if x.mean() > 0:  # a decision on a value: the traced path, checked by the host
            return F.gaussian_nll_loss(y, x, x * 0.5 + 0.1, reduction="none") + torch.relu(y)
        return x - 1


def get_inputs():
    return [torch.rand(256, 4096) + 0.1, torch.randn(256, 4096)]


def get_init_inputs():
    return []
"""

_TRANSPOSED_RESIDUAL = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(96, 96)

    def forward(self, x):
        return x + 0.5 * self.fc(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def get_inputs():
    return [torch.randn(4, 96, 30, 33)]


def get_init_inputs():
    return []
"""

_ROTARY = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.randn(300, 32), persistent=False)

    def forward(self, x):
        pos = torch.arange(x.size(1), device=x.device)[None, :].expand(x.size(0), -1)
        sin = self.table[pos].repeat_interleave(2, dim=-1).unsqueeze(2)
        rot = torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)
        return x * sin.cos() + rot * sin


def get_inputs():
    return [torch.randn(4, 256, 8, 64)]


def get_init_inputs():
    return []
"""

_HEADS = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(512, 1536)

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, 8, 64).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax((q @ k.transpose(-2, -1)) * 0.125, dim=-1)
        return torch.relu(att @ v).sum()


def get_inputs():
    return [torch.randn(32, 1024, 512)]  # 4.3 GFLOP a head's call: looped


def get_init_inputs():
    return []
"""

_SUMMED = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(1024, 2048)

    def forward(self, x):
        return torch.relu(self.fc(x)).sum(), (self.fc(x) / 2).sum(dim=1, keepdim=True) * 1.5


def get_inputs():
    return [torch.rand(64, 1024)]


def get_init_inputs():
    return []
"""

CASES = {
    "fire_module_cat_in_place": (_FIRE, "written in place by its operands' kernels"),
    "exclusive_cumsum_cat_in_place": (_CUMSUM, "written in place by its operands' kernels"),
    "gemm_batch_norm_columns": (_GEMM_BN, "a lane per column"),
    "repeated_layers_one_kernel": (_REPEATED, ""),
    "activations_on_the_special_function_unit": (_ACTIVATIONS, "sg_mish("),
    "row_exponentials_on_the_special_function_unit": (_ROW_EXPONENTIALS, "sg_row_exp("),
    "reductions_of_shared_rows_in_one_pass": (_LABEL_SMOOTHING, "__rows"),
    "order_statistics_one_sort": (_ORDER, "bitonic"),
    "scatter_add_and_index_add_atomics": (_SCATTER, "atomicAdd"),
    "topk_and_argsort_indices": (_ARGSORT, "positions"),
    "branch_on_a_value_guarded": (_GUARDED, "KERNELS.guard("),
    "transposed_operand_through_tiles": (_TRANSPOSED_RESIDUAL, "read transposed"),
    "linear_bias_in_cublaslt": (_TRANSPOSED_RESIDUAL, "bias=_get(self, 'fc.bias'))"),
    "rotary_pairs_interleaved_on_load": (_ROTARY, "interleave"),
    "heads_split_from_one_projection_looped": (_HEADS, "for _i in range(8):"),
    "sum_over_features_of_a_product": (_SUMMED, "_summed__"),
}


def _on_the_gpu(source: str, program) -> tuple[dict, object, object]:  # noqa: ANN001
    """The problem's namespace, its seeded ``Model`` and the program's ``ModelNew`` holding
    the same weights, both on the GPU, TF32 off."""
    import torch

    from stitch_graph.runtime.kernels import KernelLibrary

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    namespace: dict = {"__name__": "reference"}
    exec(compile(source, "<reference>", "exec"), namespace)  # noqa: S102
    torch.manual_seed(0)
    reference = namespace["Model"]().cuda()
    host = {"KERNELS": KernelLibrary(program.kernel_source), "__name__": "candidate"}
    exec(compile(program.host_source, "<host>", "exec"), host)  # noqa: S102
    model = host["ModelNew"]().cuda()
    model.load_state_dict(reference.state_dict())
    model.train(reference.training)
    return namespace, reference, model


def _matches_pytorch(source: str, program) -> None:  # noqa: ANN001
    """The program's output matches PyTorch's at 1e-4 on three fresh draws (TF32 off)."""
    import torch

    namespace, reference, model = _on_the_gpu(source, program)
    for seed in range(3):
        torch.manual_seed(seed)
        inputs = [x.cuda() for x in namespace["get_inputs"]()]
        with torch.no_grad():
            torch.testing.assert_close(model(*inputs), reference(*inputs), rtol=1e-4, atol=1e-4)


def _matched_then_timed(source: str, program, other=None) -> tuple[float, float]:  # noqa: ANN001
    """Both programs matched against PyTorch at 1e-4 on three draws (TF32 off), then timed in
    turns in one process: ``(program's ms, other's ms)``, the best of three medians each;
    without ``other``, against eager PyTorch."""
    import torch

    from stitch_graph.execution.timing import time_cuda

    namespace, reference, model = _on_the_gpu(source, program)
    second = reference if other is None else _on_the_gpu(source, other)[2]
    with torch.no_grad():
        for seed in range(3):
            torch.manual_seed(seed)
            inputs = [x.cuda() for x in namespace["get_inputs"]()]
            expected = reference(*inputs)
            torch.testing.assert_close(model(*inputs), expected, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(second(*inputs), expected, rtol=1e-4, atol=1e-4)
        turns = [
            [time_cuda(lambda m=m: m(*inputs), runs=20)["median_ms"] for m in (model, second)]
            for _ in range(3)
        ]
    ours, theirs = (min(column) for column in zip(*turns, strict=True))
    return ours, theirs


@pytest.mark.parametrize("case", sorted(CASES))
def test_generated_program_matches_pytorch_on_the_gpu(case: str) -> None:
    import re

    from stitch_graph.codegen import capture_program, emit_candidate, plan_program
    from stitch_graph.task import load_task

    source, marker = CASES[case]
    task = load_task(source)
    ir = capture_program(task)
    program = emit_candidate(ir, plan_program(ir))
    assert marker in program.host_source + program.kernel_source
    if case == "repeated_layers_one_kernel":  # six GELU epilogues, one kernel (and its twin)
        assert len(set(re.findall(r"void (k\w+)\(", program.kernel_source))) <= 2
    _matches_pytorch(source, program)


def test_a_guarded_program_raises_for_an_input_on_another_path() -> None:
    import torch

    from stitch_graph.codegen import capture_program, emit_candidate, plan_program
    from stitch_graph.runtime import GuardFailed
    from stitch_graph.runtime.kernels import KernelLibrary
    from stitch_graph.task import load_task

    ir = capture_program(load_task(_GUARDED))
    program = emit_candidate(ir, plan_program(ir))
    host = {"KERNELS": KernelLibrary(program.kernel_source), "__name__": "candidate"}
    exec(compile(program.host_source, "<host>", "exec"), host)  # noqa: S102
    model = host["ModelNew"]().cuda()
    x, y = (torch.rand(256, 4096, device="cuda") + 0.1), torch.randn(256, 4096, device="cuda")
    model(x, y)
    with pytest.raises(GuardFailed):
        model(-x, y)


_LSTM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(128, 256, 4, batch_first=True)
        self.fc = nn.Linear(256, 10)

    def forward(self, x, h0, c0):
        out, _ = self.lstm(x, (h0, c0))
        return self.fc(out[:, -1, :])


def get_inputs():
    return [torch.rand(10, 256, 128), torch.randn(4, 10, 256), torch.randn(4, 10, 256)]


def get_init_inputs():
    return []
"""


def test_an_rnn_left_to_cudnn_reads_one_weight_buffer_at_eagers_speed() -> None:
    """``rnn_library``: PyTorch's cuDNN LSTM runs with the program's weights laid out once in
    one buffer, as nn.LSTM keeps its own, so no call compacts them again (KernelBench L3
    35_LSTM ran at 0.90x eager for that copy): same outputs, no compaction warning, and the
    program's time within 5% of eager's. Both are bound by cuDNN's host side (about 25 ms of
    CPU against 5 ms of kernels a call, under torch.profiler), whose time drifts from one
    timing to the next, so the two are timed in turns and the best median of each compared."""
    import warnings

    import torch

    from stitch_graph.codegen import (
        KernelTuning,
        Tuning,
        capture_program,
        emit_candidate,
        plan_program,
    )
    from stitch_graph.execution.timing import time_cuda
    from stitch_graph.task import load_task

    ir = capture_program(load_task(_LSTM))
    tuning = Tuning(default=KernelTuning(rnn_library=True))
    program = emit_candidate(ir, plan_program(ir), tuning=tuning)
    assert "KERNELS.rnn_weights(" in program.host_source
    namespace, reference, model = _on_the_gpu(_LSTM, program)
    torch.manual_seed(1)
    inputs = [x.cuda() for x in namespace["get_inputs"]()]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # PyTorch warns when it compacts separate weights
        torch.testing.assert_close(model(*inputs), reference(*inputs), rtol=1e-4, atol=1e-4)
        weights = [p for name, p in model.named_parameters() if name.startswith("lstm.")]
        assert len({w.untyped_storage().data_ptr() for w in weights}) == 1
        turns = [
            [time_cuda(lambda m=m: m(*inputs), runs=10)["median_ms"] for m in (model, reference)]
            for _ in range(4)
        ]
        ours, eager = (min(column) for column in zip(*turns, strict=True))
    print(f"LSTM left to cuDNN: program {ours:.3f} ms, eager {eager:.3f} ms")
    assert ours <= 1.05 * eager
