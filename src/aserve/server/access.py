"""Who may call what: bearer tokens per kind of endpoint, and CORS for browser pages.

Endpoints are of three kinds:

- OPEN: health (`/v2/health/live`, `/v2/health/ready`, `/v2/models/{m}[/versions/{v}]/ready`),
  `/metrics`, and the API's own description (`/v2/openapi.json`, `/v2/docs`);
- API: inference and metadata (`--api-token`);
- ADMIN: the repository extension (index, load, unload) and trace settings
  (`--admin-token`; without one, the api token guards them too when it is set).

The admin token is accepted wherever the api token is. A request without
`Authorization: Bearer <token>` where one is needed gets 401 (`WWW-Authenticate:
Bearer`); a token that is not the endpoint's gets 403. Tokens are compared in
constant time. With no token set, nothing is checked and nothing is paid.

CORS (`--cors-origin`, off by default): a preflight (OPTIONS with
Access-Control-Request-Method) from an allowed origin is answered 204 with the methods
and headers allowed; responses to allowed origins carry Access-Control-Allow-Origin and
expose the headers clients read (Inference-Header-Content-Length, Retry-After, ...).
"""

from __future__ import annotations

import hmac
from typing import Literal

from ..errors import Forbidden, Unauthorized
from ..inference import Answer
from .errors import error_response
from .http import Request, Response

Level = Literal["open", "api", "admin"]
OPEN: Level = "open"
API: Level = "api"
ADMIN: Level = "admin"


class Access:
    """The tokens each kind of endpoint takes."""

    __slots__ = ("_admin", "_api", "admin_flag", "api_flag")

    def __init__(self, *, admin_token: str | None, api_token: str | None) -> None:
        admin = [admin_token.encode()] if admin_token else []
        api = [api_token.encode()] if api_token else []
        self._api: list[bytes] = api + admin if api else []  # empty: open
        self._admin: list[bytes] = admin or api
        self.api_flag = "--api-token"
        self.admin_flag = "--admin-token" if admin else "--api-token"

    @property
    def guards_api(self) -> bool:
        return bool(self._api)

    @property
    def guards_anything(self) -> bool:
        return bool(self._api or self._admin)

    def check(self, request: Request, level: Level) -> None:
        """Raise Unauthorized (no bearer token) or Forbidden (another token) unless the
        request may call an endpoint of `level`."""
        if level != OPEN:
            self.check_credential(request.headers.get("authorization"), level)

    def check_credential(self, header: str | None, level: Level) -> None:
        """`check` for a front that read the `authorization` value itself (gRPC metadata)."""
        if level == OPEN:
            return
        tokens = self._api if level == API else self._admin
        if not tokens:
            return
        flag = self.api_flag if level == API else self.admin_flag
        what = "inference and metadata" if level == API else "the repository and trace-setting endpoints"
        if header is None:
            raise Unauthorized(f"{what} need a bearer token: send `Authorization: Bearer <token>` (gRPC: `authorization` metadata) with the token the "
                               f"server was started with ({flag})")
        scheme, _, given = header.strip().partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise Unauthorized(f"Authorization: expected `Bearer <token>` ({flag}), got a {scheme!r} credential")
        presented = given.strip().encode()
        ok = False
        for token in tokens:  # every one compared, in constant time
            ok |= hmac.compare_digest(presented, token)
        if not ok:
            raise Forbidden(f"the bearer token is not valid for {what} (they take the server's {flag})")


EXPOSED = "Inference-Header-Content-Length, Retry-After, WWW-Authenticate, Content-Length, Content-Type"
ALLOWED_HEADERS = ("Authorization, Content-Type, Content-Encoding, Accept, Inference-Header-Content-Length, "
                   "traceparent, tracestate, baggage")


class Cors:
    """The origins browser pages may call from (`*` for any)."""

    __slots__ = ("any", "origins")

    def __init__(self, origins: list[str]) -> None:
        self.any = "*" in origins
        self.origins = frozenset(o.rstrip("/") for o in origins if o != "*")

    def allows(self, origin: str) -> bool:
        return self.any or origin in self.origins

    def add(self, request: Request, response: Response | Answer) -> None:
        """The CORS headers of a response to an allowed origin."""
        origin = request.headers.get("origin")
        if origin is None or not self.allows(origin):
            return
        headers = response.headers
        headers["Access-Control-Allow-Origin"] = "*" if self.any else origin
        headers["Access-Control-Expose-Headers"] = EXPOSED
        if not self.any:
            headers["Vary"] = "Origin"

    def preflight(self, request: Request) -> Response:
        """The answer to a preflight (OPTIONS with Access-Control-Request-Method)."""
        origin = request.headers.get("origin", "")
        if not self.allows(origin):
            return error_response(request, 403, f"CORS: origin {origin!r} is not allowed (the server's --cors-origin "
                                                f"list does not name it)")
        wanted = request.headers.get("access-control-request-headers")
        response = Response(204, headers={
            "Access-Control-Allow-Origin": "*" if self.any else origin,
            "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
            "Access-Control-Allow-Headers": wanted or ALLOWED_HEADERS,
            "Access-Control-Max-Age": "600",
        })
        if not self.any:
            response.headers["Vary"] = "Origin"
        return response
