"""What the hot routes read from a request, whichever HTTP front parsed it.

aiohttp's `web.BaseRequest` and the wire front's `WireRequest` both have these members;
the infer and predict handlers, the error answers and the access checks are written
against this protocol, so that one handler serves both fronts.
"""

from __future__ import annotations

from typing import Any, Protocol

from multidict import CIMultiDictProxy


class Body(Protocol):
    """The request body as the handlers read it (aiohttp's `StreamReader` has these)."""

    def is_eof(self) -> bool: ...

    def read_nowait(self, n: int = -1) -> bytes: ...


class HttpRequest(Protocol):
    @property
    def method(self) -> str: ...

    @property
    def path(self) -> str: ...

    @property
    def raw_path(self) -> str: ...

    @property
    def headers(self) -> CIMultiDictProxy[str]: ...

    @property
    def content(self) -> Body: ...

    @property
    def protocol(self) -> Any: ...

    @property
    def remote(self) -> str | None: ...

    async def read(self) -> bytes: ...
