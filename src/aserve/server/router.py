"""From a request to its route and its answer: matching, the checks its head gets, the handler.

`Dispatcher.head` runs as soon as a request's head has arrived, before its body: it matches
the route (404, 405), checks access (401, 403), the body's announced size (413), its
Content-Type and Content-Encoding (415), an `Expect` (417), and the route's own head
check (an infer route looks its model up, 404, and asks whether its queue would refuse
any request now, 503). What it refuses is answered at once, without reading the body.
`Dispatcher.respond` runs the handler once the body is whole and maps whatever it raises
to an error answer (`Dispatcher.failed`, `errors.from_exception`); with CORS on, every
answer (errors too) carries its headers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import TypeVar
from urllib.parse import unquote

from ..bounded import Bounded
from ..dataplane.plane import Pending
from ..errors import AserveError, PayloadTooLarge
from ..inference import Answer
from ..protocol.formats import MSGPACK, body_format, check_encoding
from .app import App
from .errors import ExpectationFailed, MethodNotAllowed, RouteNotFound, from_exception
from .http import Request, Response
from .routes import Route

R = TypeVar("R", Response, Answer, Response | Answer)
# what a route template's segment is: ("", literal) | (name, "") | (name, ":suffix")
Segment = tuple[str, str]


def _segments(template: str) -> tuple[Segment, ...]:
    out: list[Segment] = []
    for part in template.split("/")[1:]:
        if part.startswith("{"):
            name, _, suffix = part[1:].partition("}")
            out.append((name, suffix))
        else:
            out.append(("", part))
    return tuple(out)


def too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"request body exceeds the server's limit of {limit} bytes (--max-body-bytes)")


class Router:
    """Matches requests to `routes` (earlier routes win), remembering the paths clients repeat."""

    def __init__(self, routes: Sequence[Route]) -> None:
        self.routes = tuple(routes)
        self._by_length: dict[int, list[tuple[Route, tuple[Segment, ...]]]] = {}
        for route in self.routes:
            segments = _segments(route.path)
            self._by_length.setdefault(len(segments), []).append((route, segments))
        # (method, raw path) -> (route, params): the infer paths clients send again and again
        self._known: Bounded[tuple[str, str], tuple[Route, dict[str, str]]] = Bounded(1024)

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        """The route for `method` and the raw (still percent-encoded) `path`, with its
        parameters; RouteNotFound, or MethodNotAllowed naming the methods the path has."""
        key = (method, path)
        known = self._known.get(key)
        if known is not None:
            return known
        parts = [unquote(p, errors="strict") if "%" in p else p for p in path.split("/")[1:]]
        allowed: list[str] = []
        look = "GET" if method == "HEAD" else method
        for route, segments in self._by_length.get(len(parts), ()):
            params = _bind(segments, parts)
            if params is None:
                continue
            if route.method == look:
                return self._known.remember(key, (route, params))
            if route.method not in allowed:
                allowed.append(route.method)
        if allowed:
            raise MethodNotAllowed(f"Method Not Allowed: {method} {path}", allowed)
        raise RouteNotFound(f"Not Found: {method} {path}")


def _bind(segments: tuple[Segment, ...], parts: list[str]) -> dict[str, str] | None:
    params: dict[str, str] = {}
    for (name, text), part in zip(segments, parts):
        if not name:
            if part != text:
                return None
        elif text:
            if not part.endswith(text) or len(part) == len(text):
                return None
            params[name] = part[: -len(text)]
        elif part:
            params[name] = part
        else:
            return None
    return params


class Dispatcher:
    """The HTTP front's answer to each request, from its head on."""

    def __init__(self, app: App, router: Router) -> None:
        self.app = app
        self.router = router
        self._guarded = app.access.guards_anything

    def head(self, request: Request, length: int | None) -> Response | None:
        """The answer the head alone decides (a refusal, or a CORS preflight), or None when the
        request goes on to its handler. `length`: the body's announced size (None: chunked)."""
        app = self.app
        headers = request.headers
        try:
            cors = app.cors
            if cors is not None and request.method == "OPTIONS" and "access-control-request-method" in headers:
                return self._cors(request, cors.preflight(request))
            route, request.params = self.router.match(request.method, request.path)
            request.route = route
            if self._guarded:
                app.access.check(request, route.level)
            if length is None or length > 0:
                if length is not None and length > app.max_body_bytes:
                    raise too_large(app.max_body_bytes)
                content_type = headers.get("content-type")
                if route.request is not None and content_type is not None:
                    body_format(content_type, msgpack=MSGPACK in route.formats)  # 415 unless the route reads it
                encoding = headers.get("content-encoding")
                if encoding is not None:
                    check_encoding(encoding)
            if "expect" in headers and headers["expect"].lower() != "100-continue":
                raise ExpectationFailed(f"Expect: expected 100-continue, got {headers['expect']!r}")
            head = route.head
            if head is not None:
                head(app, request)
        except (AserveError, UnicodeDecodeError) as exc:
            if isinstance(exc, UnicodeDecodeError):
                exc = RouteNotFound(f"Not Found: {request.method} {request.path} (malformed percent-escape)")
            return self._cors(request, from_exception(request, exc, app.policy))
        return None

    def again(self, request: Request) -> Response | None:
        """`head` for a head met before, byte for byte, whose checks passed: the route and its
        parameters are known, and only the route's own check runs again (the model it names
        may have been unloaded meanwhile)."""
        head = request.route.head
        if head is None:
            return None
        try:
            head(self.app, request)
        except AserveError as exc:
            return self._cors(request, from_exception(request, exc, self.app.policy))
        return None

    def ahead(self, request: Request) -> Response | None:
        """The part of the route's head check it left for a body still on the way
        (`Request.ahead`), asked once: the refusal it decides, or None."""
        check = request.ahead
        if check is None:
            return None
        request.ahead = None
        try:
            check(self.app, request)
        except AserveError as exc:
            return self._cors(request, from_exception(request, exc, self.app.policy))
        return None

    def respond(self, request: Request) -> Awaitable[Response | Answer] | Pending:
        """The handler's answer to a request whose head passed and whose body is whole (what it
        raises goes to `failed`; the answer, to `finish`)."""
        route: Route = request.route
        return route.handler(self.app, request)

    def failed(self, request: Request, exc: BaseException) -> Response:
        """The answer to a request whose handler raised `exc` (the server goes on)."""
        return self._cors(request, from_exception(request, exc, self.app.policy))

    def finish(self, request: Request, response: Response | Answer) -> Response | Answer:
        """A handler's answer as it is sent: with the CORS headers when CORS is on."""
        return response if self.app.cors is None else self._cors(request, response)

    def _cors(self, request: Request, response: R) -> R:
        cors = self.app.cors
        if cors is not None:
            cors.add(request, response)
        return response
