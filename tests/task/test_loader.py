"""Tests for ``stitch_graph.task.load_task``: a corpus of bad problems and a few good ones."""

from __future__ import annotations

import pickle
import textwrap
from pathlib import Path

import pytest
import torch

from stitch_graph.artifacts import TensorSpec
from stitch_graph.task import TaskLoadError, infer_outputs, load_task

BAD = Path(__file__).resolve().parent.parent / "fixtures" / "bad_problems"

# file -> (phrase the message must contain, phrase the fix must contain)
BAD_CASES: dict[str, tuple[str, str]] = {
    "syntax_error.py.txt": ("syntax_error.py.txt:7: syntax error", "correct the Python syntax"),
    "no_model.py": ("defines no `Model`", "define `class Model(nn.Module)`"),
    "model_not_module.py": ("not a subclass of torch.nn.Module", "make Model subclass"),
    "no_get_inputs.py": ("defines no `get_inputs`", "define `get_inputs()`"),
    "get_inputs_not_callable.py": ("`get_inputs` is a list", "define `get_inputs()`"),
    "get_inputs_dict.py": ("returned a dict, not a list", "return a list of forward arguments"),
    "get_inputs_string.py": ("returned a str, not a list", "return a list of forward arguments"),
    "numpy_input.py": ("entry 1 is a numpy.ndarray", "torch.from_numpy"),
    "missing_import.py": (
        "no module named 'stitch_no_such_module'",
        "install 'stitch_no_such_module'",
    ),
    "module_level_raise.py": ("module_level_raise.py:7: the module-level code raised KeyError",
                              "must not raise"),
    "model_init_raises.py": ("raised ValueError: features must be positive",
                             "construct without errors"),
    "init_inputs_object.py": ("entry 0 is (or holds) a Linear", "init inputs must be plain values"),
    "init_inputs_not_list.py": ("get_init_inputs() returned an int",
                                "return a list of constructor"),
    "forward_raises.py": ("forward_raises.py:9: Model.forward raised RuntimeError",
                          "make Model.forward run"),
    "forward_returns_dict.py": ("forward's return value is a dict", "return a tensor or a tuple"),
    "empty_get_inputs.py": ("returned an empty list", "return at least one torch.Tensor"),
    "no_tensor_inputs.py": ("returned no tensors", "return at least one torch.Tensor"),
}


def test_every_bad_fixture_has_a_case() -> None:
    on_disk = {p.name for p in BAD.iterdir() if p.is_file()}
    assert on_disk == set(BAD_CASES)
    assert len(on_disk) >= 10


@pytest.mark.parametrize("filename", sorted(BAD_CASES))
def test_bad_problem_raises_with_file_and_fix(filename: str) -> None:
    what, fix = BAD_CASES[filename]
    path = BAD / filename
    with pytest.raises(TaskLoadError) as info:
        load_task(path)
    err = info.value
    message = str(err)
    assert str(path) in message
    assert err.path == str(path)
    assert what in message
    assert fix in err.fix
    assert f"Fix: {err.fix}" in message


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.py"
    with pytest.raises(TaskLoadError, match="does not exist") as info:
        load_task(path)
    assert str(path) in str(info.value)
    assert "check the path" in info.value.fix
    with pytest.raises(TaskLoadError, match="does not exist"):
        load_task(str(path))  # a string path is recognised as a path too


def test_directory_is_not_a_problem(tmp_path: Path) -> None:
    with pytest.raises(TaskLoadError, match="is a directory"):
        load_task(tmp_path)


def test_error_is_a_value_error_and_pickles() -> None:
    with pytest.raises(ValueError) as info:
        load_task(BAD / "no_model.py")
    err = pickle.loads(pickle.dumps(info.value))
    assert isinstance(err, TaskLoadError)
    assert (err.path, err.fix, str(err)) == (info.value.path, info.value.fix, str(info.value))


def _write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


SOFTMAX = """\
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.dim = dim

        def forward(self, x):
            return torch.softmax(x, dim=self.dim)

    batch_size = 64
    dim = 128

    def get_inputs():
        return [torch.randn(batch_size, dim)]

    def get_init_inputs():
        return [1]
"""


def test_good_problem_from_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "softmax_row.py", SOFTMAX)
    task = load_task(path)
    assert task.name == "softmax_row"
    assert task.path == str(path)
    assert task.source == path.read_text()
    assert task.inputs == [TensorSpec(shape=[64, 128], dtype="float32")]
    assert task.input_values == [None]
    assert task.init_args == [1]
    assert task.outputs == [TensorSpec(shape=[64, 128], dtype="float32")]
    assert task.parameter_count == 0


def test_good_problem_from_text() -> None:
    source = textwrap.dedent(SOFTMAX)
    task = load_task(source)
    assert task.name == "problem"
    assert task.path is None
    assert task.source == source
    assert task.outputs == [TensorSpec(shape=[64, 128])]
    assert load_task(source, name="softmax").name == "softmax"


def test_errors_from_text_name_the_problem() -> None:
    source = textwrap.dedent(SOFTMAX).replace("class Model", "class Net")
    with pytest.raises(TaskLoadError, match="<rowwise>: the problem defines no `Model`") as info:
        load_task(source, name="rowwise")
    assert info.value.path == "<rowwise>"


def test_tuple_outputs_dtypes_params_and_plain_args(tmp_path: Path) -> None:
    path = _write(tmp_path, "multi.py", """\
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self, features, sizes, act):
                super().__init__()
                self.fc = nn.Linear(features, sizes[0])
                self.act = act

            def forward(self, x, idx, scale, flag):
                y = self.fc(x) * scale
                return y, y.argmax(dim=-1), (idx * 2).to(torch.float16)

        def get_inputs():
            return [torch.randn(3, 5), torch.randint(0, 9, (7,)), 0.5, True]

        def get_init_inputs():
            return [5, (6, 2), "relu"]
    """)
    task = load_task(path)
    assert task.inputs == [
        TensorSpec(shape=[3, 5]),
        TensorSpec(shape=[7], dtype="int64"),
        None,
        None,
    ]
    assert task.input_values == [None, None, 0.5, True]
    assert task.init_args == [5, [6, 2], "relu"]
    assert task.outputs == [
        TensorSpec(shape=[3, 6]),
        TensorSpec(shape=[3], dtype="int64"),
        TensorSpec(shape=[7], dtype="float16"),
    ]
    assert task.parameter_count == 5 * 6 + 6
    assert task.model_dump_json()  # everything recorded serialises


def test_missing_get_init_inputs_means_no_args(tmp_path: Path) -> None:
    path = _write(tmp_path, "noinit.py", """\
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def forward(self, x):
                return x.sum(dim=0, keepdim=True)

        def get_inputs():
            return (torch.randn(10, 4),)
    """)
    task = load_task(path)
    assert task.init_args == []
    assert task.outputs == [TensorSpec(shape=[1, 4])]


def test_fake_tensor_fallback_when_meta_fails(tmp_path: Path) -> None:
    # The forward creates a CPU tensor, which a meta-tensor run cannot mix with its inputs.
    path = _write(tmp_path, "makes_tensor.py", """\
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def forward(self, x):
                return x + torch.linspace(0, 1, x.shape[-1])

        def get_inputs():
            return [torch.randn(4096, 4096)]
    """)
    task = load_task(path)
    assert task.outputs == [TensorSpec(shape=[4096, 4096])]


def test_infer_outputs_reports_the_route() -> None:
    model = torch.nn.Linear(4, 3)
    found = infer_outputs(model, [torch.randn(2, 4)])
    assert (found.method, found.outputs, found.failures) == ("meta", [TensorSpec(shape=[2, 3])], {})

    class MakesTensor(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.ones(x.shape[-1])

    found = infer_outputs(MakesTensor(), [torch.randn(2, 4)])
    assert found.method == "fake"
    assert set(found.failures) == {"meta"}


_DATA_DEPENDENT = """\
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def forward(self, x):
            n = int((x > 0).sum().item()) % 3 + 2
            return x[:, :n]

    def get_inputs():
        return [torch.randn({rows}, 8)]
"""


def test_small_data_dependent_problem_runs_for_real(tmp_path: Path) -> None:
    path = _write(tmp_path, "small.py", _DATA_DEPENDENT.format(rows=16))
    task = load_task(path)
    assert len(task.outputs) == 1
    assert task.outputs[0].shape[0] == 16


def test_large_data_dependent_problem_leaves_outputs_empty(tmp_path: Path) -> None:
    path = _write(tmp_path, "large.py", _DATA_DEPENDENT.format(rows=1024 * 1024))
    task = load_task(path)
    assert task.outputs == []
    assert task.inputs == [TensorSpec(shape=[1024 * 1024, 8])]


def test_run_reference_false_skips_the_forward() -> None:
    source = (BAD / "forward_raises.py").read_text()
    task = load_task(source, run_reference=False)
    assert task.outputs == []
    assert task.inputs == [TensorSpec(shape=[8, 16]), TensorSpec(shape=[8, 16])]


def test_loading_is_deterministic_and_keeps_caller_rng(tmp_path: Path) -> None:
    path = _write(tmp_path, "seeded.py", """\
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(torch.randn(3))

            def forward(self, x):
                return x * self.w

        def get_inputs():
            return [torch.randn(2, 3)]
    """)
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    a = load_task(path)
    after = torch.rand(4)
    b = load_task(path)
    assert torch.equal(expected, after)
    assert a == b


def test_warnings_in_problem_code_do_not_fail_loading(tmp_path: Path) -> None:
    path = _write(tmp_path, "warns.py", """\
        import warnings

        import torch
        import torch.nn as nn

        warnings.warn("old style problem", DeprecationWarning)

        class Model(nn.Module):
            def forward(self, x):
                warnings.warn("slow path", UserWarning)
                return x * 2

        def get_inputs():
            return [torch.randn(2, 2)]
    """)
    assert load_task(path).outputs == [TensorSpec(shape=[2, 2])]
