"""The infer routes (V2 infer, TF-Serving predict, classify and regress): HTTP to the data plane and back.

The route's head check runs as soon as the request's head has arrived, before its body:
it looks the model up (404 at once for an unknown model or version) and prepares the
`InferCall` the handler completes with the body and hands to `DataPlane.submit`. What the
head alone decides about admission (`DataPlane.head`: 503 at once when the model's queue
would refuse the request whatever its body holds) is asked once the read that brought the
head is parsed, and only if the body is still on the way (`ask_ahead`): a body that came
with its head is judged in full by `DataPlane.submit` at once, and asking twice would only
double what a request, and above all a refusal, costs.
"""

from __future__ import annotations

from ..dataplane.plane import Pending
from ..inference import InferCall
from ..protocol import V2
from ..protocol.v2 import HEADER_LENGTH, header_length
from .app import App
from .http import Request
from .spans import http_span

_HEADER_LENGTH = HEADER_LENGTH.lower()


def prepare(app: App, request: Request) -> None:
    """The head check of an infer route: the model's handle and the call, without its body;
    what the data plane refuses from the head raises."""
    route = request.route
    params = request.params
    model = params["model"]
    version = params.get("version") or params.get("label")
    handle = app.plane.registry.get(model, version)
    h = request.headers
    codec = route.codec
    length = h.get(_HEADER_LENGTH)
    call = InferCall(
        codec=codec, model=model, version=version, content_type=h.get("content-type"), accept=h.get("accept"),
        header_length=None if length is None or codec is not V2 else header_length(length), headers=h,
        received=request.received, route=route.path, host=h.get("host", ""), held=request.held,
        whole=request.whole, client=None if request.connection is None else id(request.connection),
        describe=http_span,
    )
    request.state = handle, call
    request.ahead = ask_ahead


def ask_ahead(app: App, request: Request) -> None:
    """What the data plane refuses from the head (raises), for a request whose body is still
    on the way."""
    handle, call = request.state
    app.plane.head(call, handle=handle)


def judged_again(request: Request) -> bool:
    """Whether `request` is an infer call that its model's admission refused after decoding it
    (`DataPlane.refuse_again` can judge its bytes again)."""
    state = request.state
    return type(state) is tuple and len(state) == 2 and type(state[1]) is InferCall and state[1].admission is not None


def infer(app: App, request: Request) -> Pending:
    """The call completed with the body, to the data plane; its Answer is the 200 response
    (the connection learns it from the Pending, with no task of its own)."""
    handle, call = request.state
    call.body = request.body
    return app.plane.submit(call, handle=handle)
