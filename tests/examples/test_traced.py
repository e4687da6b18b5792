"""`traced`: the model instrumented with the OpenTelemetry API alone answers in every engine
when nothing traces it (the API's no-op tracer); traced, see tests/tracing/test_otel_api.py."""

from __future__ import annotations

import array
import sys

import pytest

from aserve.engine import Pool
from aserve.tensor import Tensor

from .helpers import ENGINES, spec


@pytest.mark.parametrize("engine", ENGINES)
async def test_scales_by_two_without_a_feature_service_or_tracing(engine: str) -> None:
    rows = array.array("f", [1.0, -2.5, 3.25, 0.0, 1e6, -1e-3, 7.0, 8.5])
    async with Pool(engine=engine, interpreters=1) as pool:
        info = await pool.load(spec("traced"))
        assert info.class_name == "Scaler"
        out = await pool.infer("traced", {"X": Tensor("FP32", (2, 4), rows.tobytes())})
    y = out["Y"]
    assert (y.datatype, y.shape) == ("FP32", (2, 4))
    assert list(memoryview(y.data).cast("B").cast("f")) == [v * 2.0 for v in rows]


def test_serves_untraced_where_opentelemetry_is_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without opentelemetry-api the bundled example still loads and answers (the examples
    folder is what `aserve serve` serves by default)."""
    import importlib.util

    from ..conftest import EXAMPLES

    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # `import opentelemetry` raises ImportError
    spec = importlib.util.spec_from_file_location("_traced_without_otel", EXAMPLES / "traced" / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.tracer is None
    model = module.Scaler()
    model.parameters = {}
    model.load()
    x = memoryview(array.array("f", [1.0, -2.0, 0.5, 4.0]).tobytes())
    assert list(model({"X": x})["Y"].cast("f")) == [2.0, -4.0, 1.0, 8.0]
