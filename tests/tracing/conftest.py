"""The server fixtures of tests/server, for servers traced here, and a real OTLP/HTTP receiver."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from ..peers import Receiver
from ..server.conftest import repository  # noqa: F401 - fixtures


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    r = Receiver()
    async with r.serving() as port:
        yield r, f"http://127.0.0.1:{port}"


def attrs(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in span.attributes:
        v = a.value
        out[a.key] = getattr(v, v.WhichOneof("value"))
    return out
