"""The runtime's load/unload bookkeeping, in this interpreter (no torch needed)."""

from __future__ import annotations

import json
import linecache
import pathlib
import sys

import pytest

from aserve.runtime import _worker

SOURCE = '''
from aserve.runtime import Model


class Raiser(Model):
    def __call__(self, inputs):
        raise ValueError("always")  # MARK
'''


def _mark_line(path: pathlib.Path) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if "# MARK" in line)


def test_tracebacks_show_the_code_that_runs_after_the_file_is_edited(tmp_path: pathlib.Path) -> None:
    model = tmp_path / "model.py"
    model.write_text(SOURCE)
    line = _mark_line(model)
    _worker.load("raiser", json.dumps({"path": str(tmp_path)}))
    try:
        model.write_text("# moved\n# down\n" + SOURCE.replace("always", "edited"))
        with pytest.raises(ValueError) as caught:
            _worker.infer("raiser", [])
        text = _worker.format_exception(caught.value)
        assert f'model.py", line {line}, in __call__' in text
        assert 'raise ValueError("always")  # MARK' in text
    finally:
        _worker.unload("raiser")
    assert str(model) not in linecache.cache  # unloading forgets the lines with the module
    assert "aserve_model_raiser" not in sys.modules


def test_a_failed_load_leaves_nothing_behind(tmp_path: pathlib.Path) -> None:
    (tmp_path / "model.py").write_text("from aserve.runtime import Model\nclass F(Model):\n"
                                       "    def load(self):\n        raise OSError('no weights')\n")
    with pytest.raises(_worker.LoadError, match=r"F failed to load: OSError: no weights"):
        _worker.load("failing", json.dumps({"path": str(tmp_path)}))
    assert "failing" not in _worker._models and "aserve_model_failing" not in sys.modules
