"""Weights read from files are mappings of the file: load_weights, and the runtime's defaults.

These run in the test process (torch is there on 3.11); `installed` puts the runtime's
torch.load / load_state_dict defaults in place for a test and takes them out after.
"""

from __future__ import annotations

import io
import json
import pathlib
import struct
from collections.abc import Iterator
from typing import Any

import pytest

from ..conftest import needs_torch

pytestmark = needs_torch


@pytest.fixture
def installed() -> Iterator[None]:
    from aserve.runtime import weights

    was = weights._installed
    weights.install()
    yield
    if not was:
        weights.uninstall()


def net() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).eval()


@pytest.fixture
def checkpoint(tmp_path: pathlib.Path) -> pathlib.Path:
    import torch

    path = tmp_path / "weights.pt"
    torch.save(net().state_dict(), path)
    return path


def test_load_weights_maps_a_checkpoint_and_writes_stay_private(checkpoint: pathlib.Path) -> None:
    import torch

    from aserve.runtime import load_weights
    from aserve.runtime.weights import file_backed

    on_disk = checkpoint.read_bytes()
    state = load_weights(checkpoint)
    reference = net().state_dict()
    assert state.keys() == reference.keys()
    for name, tensor in state.items():
        assert torch.equal(tensor, reference[name])
        assert file_backed(tensor), name
    state["0.weight"][0, 0] = 42.0  # copy on write: the file and other mappings keep their bytes
    assert checkpoint.read_bytes() == on_disk
    assert load_weights(checkpoint)["0.weight"][0, 0] == reference["0.weight"][0, 0]


def test_load_weights_into_a_meta_module_makes_its_parameters_the_mapping(checkpoint: pathlib.Path) -> None:
    import torch

    from aserve.runtime import load_weights
    from aserve.runtime.weights import file_backed

    with torch.device("meta"):
        empty = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    loaded = load_weights(checkpoint, into=empty)
    assert loaded is empty
    assert all(file_backed(p) for p in loaded.parameters())
    x = torch.randn(3, 64)
    with torch.inference_mode():
        assert torch.equal(loaded(x), net()(x))


def _safetensors(path: pathlib.Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset, blobs = 0, []
    for name, (dtype, shape, blob) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def test_load_weights_reads_safetensors_without_the_package(tmp_path: pathlib.Path) -> None:
    import torch

    from aserve.runtime import load_weights
    from aserve.runtime.weights import file_backed

    path = tmp_path / "model.safetensors"
    _safetensors(path, {
        "a": ("F32", [2, 3], struct.pack("<6f", *range(6))),
        "b": ("I64", [2], struct.pack("<2q", -1, 7)),
        "c": ("BF16", [2], torch.tensor([1.5, -2.0], dtype=torch.bfloat16).view(torch.uint8).numpy().tobytes()),
    })
    state = load_weights(path)
    assert torch.equal(state["a"], torch.arange(6, dtype=torch.float32).reshape(2, 3))
    assert state["b"].tolist() == [-1, 7]
    assert state["c"].dtype == torch.bfloat16 and state["c"].tolist() == [1.5, -2.0]
    assert all(file_backed(t) for t in state.values())
    _safetensors(path, {"a": ("F32", [4], struct.pack("<3f", 1, 2, 3))})
    with pytest.raises(ValueError, match=r"tensor 'a': data_offsets do not fit its shape and dtype"):
        load_weights(path)


def test_load_weights_refuses_a_legacy_checkpoint_with_the_fix(tmp_path: pathlib.Path) -> None:
    import torch

    from aserve.runtime import load_weights

    path = tmp_path / "old.pt"
    torch.save({"w": torch.zeros(2)}, path, _use_new_zipfile_serialization=False)
    with pytest.raises(ValueError, match=r"old.pt: not a zip-format torch checkpoint .* save it again"):
        load_weights(path)


def test_torch_load_maps_zip_checkpoints_by_default(installed: None, checkpoint: pathlib.Path,
                                                    tmp_path: pathlib.Path) -> None:
    import torch

    from aserve.runtime.weights import file_backed, policy

    assert file_backed(torch.load(checkpoint)["0.weight"])
    assert file_backed(torch.load(str(checkpoint), map_location="cpu")["0.weight"])
    assert not file_backed(torch.load(checkpoint, mmap=False)["0.weight"])  # the caller's word wins
    assert not file_backed(torch.load(io.BytesIO(checkpoint.read_bytes()))["0.weight"])  # not a path
    legacy = tmp_path / "old.pt"
    torch.save({"w": torch.ones(2)}, legacy, _use_new_zipfile_serialization=False)
    assert torch.load(legacy)["w"].tolist() == [1.0, 1.0]  # cannot be mapped: loads as before
    with policy(False):  # a model with share_weights = False
        assert not file_backed(torch.load(checkpoint)["0.weight"])


def test_load_state_dict_shares_the_weights_it_copied_from_a_mapping(installed: None,
                                                                      checkpoint: pathlib.Path) -> None:
    import torch

    from aserve.runtime.weights import file_backed

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    params = list(model.parameters())
    model.load_state_dict(torch.load(checkpoint))
    assert [id(p) for p in model.parameters()] == [id(p) for p in params]  # the same Parameter objects
    assert all(file_backed(p) and p.requires_grad for p in model.parameters())
    x = torch.randn(3, 64)
    with torch.inference_mode():
        assert torch.equal(model(x), net()(x))


def test_load_state_dict_keeps_the_copies_it_cannot_share(installed: None, checkpoint: pathlib.Path) -> None:
    import torch

    from aserve.runtime.weights import file_backed, policy

    wider = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).double()
    wider.load_state_dict(torch.load(checkpoint))  # converted on copy: not the file's bytes
    assert not any(file_backed(p) for p in wider.parameters())
    assert torch.equal(wider[0].weight, net()[0].weight.double())
    copied = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    copied.load_state_dict(torch.load(checkpoint, mmap=False))  # not from a mapping
    assert not any(file_backed(p) for p in copied.parameters())
    with policy(False):
        plain = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
        plain.load_state_dict(torch.load(checkpoint, mmap=True))
    assert not any(file_backed(p) for p in plain.parameters())


def test_torch_imported_after_the_hook_gets_the_defaults(tmp_path: pathlib.Path) -> None:
    """In an interpreter where torch is not imported yet, the runtime installs the defaults
    the moment it is (model code may do `from torch import load` at import time)."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom aserve.runtime import weights\nweights.install_when_imported()\n"
        "assert 'torch' not in sys.modules\nfrom torch import load\n"
        "print(getattr(load, '__aserve_original__', None) is not None)"
    )
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr
