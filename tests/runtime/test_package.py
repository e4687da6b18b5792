"""torch.package archives: hermetic model code, per-importer modules, clear load errors.

Archives are built here with PackageExporter in a temp folder. The tests go through
Pool.load (engine private and main) and through the runtime's own `_worker.load` inside
a private interpreter.
"""

from __future__ import annotations

import array
import json
import pathlib
import sys
import uuid
from typing import Any

import pytest

from aserve.engine import ModelSpec, Pool
from aserve.errors import ModelLoadError
from aserve.runtime import TensorSpec, _worker
from aserve.runtime.package import quiet
from aserve.tensor import Tensor

from ..conftest import HAVE_TORCH, needs_torch

IO = {"inputs": [TensorSpec("X", "FP32", (-1, 4))], "outputs": [TensorSpec("Y", "FP32", (-1, 4))]}

# A Model subclass packaged in the archive: Y = Linear(X) + K, the Linear pickled next to it.
SOURCE = """
import torch
from aserve.runtime import Model, TensorSpec

K = {k}


class AddK(Model):
    inputs = (TensorSpec("X", "FP32", (-1, 4)),)
    outputs = (TensorSpec("Y", "FP32", (-1, 4)),)
    tensor_format = "torch"

    def load(self):
        self.linear = self.package.load_pickle("weights", "linear.pkl")

    def __call__(self, inputs):
        with torch.inference_mode():
            return {{"Y": self.linear(inputs["X"]) + K}}
"""

X = [1.0, 2.0, 3.0, 4.0]
BIAS = [0.5, -0.5, 0.25, 0.0]


def linear() -> Any:
    """Linear(4, 4) with known weights: Y = 2 X + BIAS."""
    import torch

    lin = torch.nn.Linear(4, 4)
    with torch.no_grad():
        lin.weight.copy_(2 * torch.eye(4))
        lin.bias.copy_(torch.tensor(BIAS))
    return lin.eval()


def expected(k: float) -> list[float]:
    return [2 * x + b + k for x, b in zip(X, BIAS)]


def export(folder: pathlib.Path, sources: dict[str, str] | None = None, pickles: dict[str, Any] | None = None,
           archive: str = "model.pt") -> pathlib.Path:
    """A torch.package archive in `folder` with these module sources and pickles ("pkg/res": obj)."""
    from torch.package import PackageExporter

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / archive
    with quiet(), PackageExporter(str(path)) as exporter:
        exporter.extern(["torch.**", "aserve.**"])
        for name, source in (sources or {}).items():
            exporter.save_source_string(name, source)
        for where, obj in (pickles or {}).items():
            package, _, resource = where.partition("/")
            exporter.save_pickle(package, resource, obj)
    return path


def addk(folder: pathlib.Path, module: str, k: int) -> pathlib.Path:
    return export(folder, {module: SOURCE.format(k=k)}, {"weights/linear.pkl": linear()})


def package_spec(name: str, folder: pathlib.Path, package: dict[str, str], **fields: Any) -> ModelSpec:
    kwargs: dict[str, Any] = {"package": package, **fields}
    return ModelSpec(name=name, path=str(folder), **kwargs)


def x_tensor() -> dict[str, Tensor]:
    return {"X": Tensor("FP32", (1, 4), array.array("f", X))}


def floats(t: Tensor) -> list[float]:
    return list(memoryview(t.data).cast("B").cast("f"))


def load_code(key: str, folder: pathlib.Path, package: dict[str, str], **fields: Any) -> str:
    spec = {"name": key, "path": str(folder), "package": package,
            **{k: [list(s) for s in v] for k, v in fields.items()}}
    return f"from aserve.runtime import _worker\nresult = _worker.load({key!r}, {json.dumps(spec)!r})"


INFER = """
import array
from aserve.runtime import _worker
x = memoryview(array.array("f", {x})).cast("B")
out = _worker.infer({key!r}, [("X", "FP32", (1, 4), x)])
result = [float(v) for v in out[0][3][2].flatten()]
"""


# ---- through Pool.load: the host passes [package] ----


@needs_torch
@pytest.mark.parametrize("engine", ["private", "main"])
async def test_a_packaged_model_whose_module_exists_nowhere_else(engine: str, tmp_path: pathlib.Path) -> None:
    module = f"only_in_archive_{uuid.uuid4().hex}"
    folder = tmp_path / "v1"
    addk(folder, module, 1)
    async with Pool(engine=engine, interpreters=1) as pool:
        absent = f"import importlib.util; result = importlib.util.find_spec({module!r}) is None"
        assert await pool.execute(0, absent) == "True"  # not importable from sys.path
        info = await pool.load(package_spec("m", folder, {"archive": "model.pt", "object": f"{module}:AddK"}))
        assert (info.class_name, info.file) == ("AddK", str(folder / "model.pt"))
        assert info.inputs == IO["inputs"] and info.tensor_format == "torch"
        assert floats((await pool.infer("m", x_tensor()))["Y"]) == expected(1)
        await pool.unload("m")


@needs_torch
@pytest.mark.parametrize("engine", ["private", "main"])
async def test_two_versions_with_the_same_module_name_run_their_own_code(engine: str, tmp_path: pathlib.Path) -> None:
    for k in (1, 2):
        addk(tmp_path / str(k), "addmod", k)
    async with Pool(engine=engine, interpreters=2) as pool:
        for k in (1, 2):
            await pool.load(package_spec(f"m/{k}", tmp_path / str(k), {"object": "addmod:AddK"}))
        for _ in range(3):  # both loaded at once, in the same interpreters, each its own code
            for k in (1, 2):
                assert floats((await pool.infer(f"m/{k}", x_tensor()))["Y"]) == expected(k)
        interpreters = range(1) if engine == "main" else range(2)
        for i in interpreters:
            modules = "from aserve.runtime import _worker\n" \
                      "result = sorted(type(_worker._models[k].model).__module__ for k in ('m/1', 'm/2'))"
            first, second = eval(await pool.execute(i, modules))
            assert first != second and first.endswith(".addmod") and second.endswith(".addmod")


@needs_torch
@pytest.mark.parametrize("engine", ["private", "main"])
async def test_a_pickled_module_is_served_with_the_declared_inputs_and_outputs(
        engine: str, tmp_path: pathlib.Path) -> None:
    import torch

    export(tmp_path / "p", pickles={"model/net.pkl": torch.nn.Sequential(linear())})
    async with Pool(engine=engine, interpreters=1) as pool:
        info = await pool.load(package_spec("p", tmp_path / "p", {"pickle": "model/net.pkl"}, **IO))
        assert info.class_name == "Sequential (pickled model/net.pkl)"
        assert info.stages == 1  # an nn.Sequential's children are its stages
        assert floats((await pool.infer("p", x_tensor()))["Y"]) == expected(0)


@needs_torch
async def test_unloading_drops_the_importer(tmp_path: pathlib.Path) -> None:
    addk(tmp_path / "v", "addmod", 3)
    async with Pool(engine="private", interpreters=1) as pool:
        await pool.load(package_spec("m", tmp_path / "v", {"object": "addmod:AddK"}))
        await pool.execute(0, "import weakref\nfrom aserve.runtime import _worker\n"
                              "importer = weakref.ref(_worker._models['m'].importer)\nresult = importer() is not None")
        await pool.unload("m")
        assert await pool.execute(0, "result = importer() is None") == "True"


@needs_torch
async def test_package_load_errors_name_the_archive_and_the_problem(tmp_path: pathlib.Path) -> None:
    cases = error_cases(tmp_path)
    async with Pool(engine="private", interpreters=1) as pool:
        for folder, package, fields, message in cases:
            with pytest.raises(ModelLoadError) as caught:
                await pool.load(package_spec("bad", folder, package, **fields))
            assert message in str(caught.value), (package, str(caught.value))
        assert await pool.execute(0, "result = 2 + 2") == "4"


def error_cases(tmp: pathlib.Path) -> list[tuple[pathlib.Path, dict[str, str], dict[str, Any], str]]:
    """(folder, [package], extra fields, what the message must say) for every mistake."""
    import torch

    good = tmp / "good"
    archive = addk(good, "addmod", 1)
    export(good, pickles={"model/notes.pkl": {"not": "a module"}}, archive="dict.pt")
    (good / "text.pt").write_text("not a zip\n")
    torch.save({"w": torch.zeros(2)}, good / "checkpoint.pt")
    return [
        (good, {"archive": "missing.pt", "object": "addmod:AddK"}, {}, f"{good / 'missing.pt'}: torch.package archive not found"),
        (good, {"archive": "text.pt", "object": "addmod:AddK"}, {}, f"{good / 'text.pt'}: not a torch.package archive"),
        (good, {"archive": "checkpoint.pt", "object": "a:B"}, {}, f"{good / 'checkpoint.pt'}: not a torch.package archive"),
        (good, {"object": "nowhere:AddK"}, {}, f"{archive}: module 'nowhere' not found in the archive"),
        (good, {"object": "addmod:Missing"}, {}, f"{archive}: module 'addmod' in the archive has no 'Missing'"),
        (good, {"object": "addmod"}, {}, "must look like \"some.module:Name\""),
        (good, {"object": "torch.nn:Linear"}, {}, f"{archive}: torch.nn:Linear is not a subclass of aserve.runtime.Model"),
        (good, {"object": "addmod:K"}, {}, f"{archive}: addmod:K is not a class (it is a int object)"),
        (good, {"pickle": "weights/missing.pkl"}, IO, f"{archive}: no resource weights/missing.pkl in the archive"),
        (good, {"archive": "dict.pt", "pickle": "model/notes.pkl"}, IO,
         f"{good / 'dict.pt'}: model/notes.pkl holds a dict, not a torch.nn.Module"),
        (good, {"pickle": "weights/linear.pkl"}, {}, "a pickled module needs its [[inputs]] and [[outputs]] declared"),
        (good, {"object": "addmod:AddK", "pickle": "weights/linear.pkl"}, {}, "needs exactly one of object"),
        (good, {"archive": "model.pt"}, {}, "needs exactly one of object"),
        (good, {"object": "addmod:AddK", "oops": "1"}, {}, "[package] has unknown keys ['oops']"),
    ]


# ---- the runtime side, inside a private interpreter (whatever the host passes) ----


@needs_torch
async def test_the_archive_copy_wins_over_a_module_on_sys_path(tmp_path: pathlib.Path) -> None:
    for k in (1, 2):
        addk(tmp_path / str(k), "addmod", k)
    impostor = tmp_path / "path"
    impostor.mkdir()
    (impostor / "addmod.py").write_text(SOURCE.format(k=100))
    async with Pool(engine="private", interpreters=1) as pool:
        await pool.execute(0, f"import sys; sys.path.insert(0, {str(impostor)!r}); result = 1")
        try:
            for k in (1, 2):
                await pool.execute(0, load_code(f"v{k}", tmp_path / str(k), {"object": "addmod:AddK"}))
            for k in (1, 2):
                assert eval(await pool.execute(0, INFER.format(x=X, key=f"v{k}"))) == expected(k)
            weights_mapped = "from aserve.runtime import _worker, weights\n" \
                             "result = weights.file_backed(_worker._models['v1'].model.linear.weight)"
            assert await pool.execute(0, weights_mapped) == "True"  # the archive's tensors are a mapping of it
        finally:
            await pool.execute(0, "from aserve.runtime import _worker\n"
                                  "for k in ('v1', 'v2'): _worker.unload(k)\n"
                                  f"import sys; sys.path.remove({str(impostor)!r}); result = 1")


@needs_torch
async def test_errors_inside_an_interpreter_are_load_errors(tmp_path: pathlib.Path) -> None:
    cases = error_cases(tmp_path)
    async with Pool(engine="private", interpreters=1) as pool:
        for folder, package, fields, message in cases:
            code = "try:\n    " + load_code("bad", folder, package, **fields).replace("\n", "\n    ") + \
                   "\nexcept _worker.LoadError as e:\n    result = str(e)"
            text = eval(await pool.execute(0, code))
            assert message in text, (package, text)
        assert await pool.execute(0, "from aserve.runtime import _worker; result = sorted(_worker._models)") == "[]"


# ---- without torch (the 3.13 run): the settings are checked, the archive needs torch ----


def test_package_settings_are_checked_before_anything_is_opened(tmp_path: pathlib.Path) -> None:
    def load(package: dict[str, str]) -> str:
        with pytest.raises(_worker.LoadError) as caught:
            _worker.load("k", json.dumps({"path": str(tmp_path), "package": package}))
        return str(caught.value)

    assert load({"object": "a:B"}) == f"{tmp_path / 'model.pt'}: torch.package archive not found"
    assert "needs exactly one of object" in load({"object": "a:B", "pickle": "p/r.pkl"})
    assert "must look like \"package.name/resource.pkl\"" in load({"pickle": "r.pkl"})
    assert "k" not in _worker._models


@pytest.mark.skipif(HAVE_TORCH, reason="only where torch is not installed")
def test_an_archive_without_torch_says_torch_is_needed(tmp_path: pathlib.Path) -> None:
    (tmp_path / "model.pt").write_bytes(b"PK\x03\x04")
    with pytest.raises(_worker.LoadError, match=r"model.pt: loading a torch.package archive needs torch"):
        _worker.load("k", json.dumps({"path": str(tmp_path), "package": {"object": "a:B"}}))
    assert "torch" not in sys.modules
