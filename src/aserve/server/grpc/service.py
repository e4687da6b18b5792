"""`inference.GRPCInferenceService`: the Open Inference Protocol's gRPC methods, over the
same data plane, access rules, error policy and counters as the HTTP routes.

The server (`h2.GrpcServer`, as grpc's own) asks `Service.service` for each call's handler
when the call's headers arrive, before its message is read: the `authorization` metadata is checked there as HTTP checks
the header (`Access`), and a call without the method's token is refused by a handler that
never reads its message, so a refused client cannot make the server take in a large one.
A call that passes runs through `Methods.unary`: the message is parsed there (not by
grpc), so a malformed one is INVALID_ARGUMENT like any bad input; what the method raises
becomes a status (`status.status_of`), and the call is counted (`GrpcStats`,
`aserve_grpc_requests_total`) and, with `--access-log`, logged.

`ModelInfer` is an `InferCall` with the gRPC codec handed to `DataPlane.infer`, its
deadline the client's (`grpc-timeout`). `ModelStreamInfer` queues each request of the
stream with `DataPlane.submit` as it arrives and writes each answer, or its error alone
(a malformed message's too), as it is ready; while `MAX_WAITING` requests wait for their
answers to be written (a client that does not read them), it reads no more, as an HTTP
connection stops reading, so such a client holds at most that many.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import msgspec
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from grpc._cython import cygrpc

from ... import __version__
from ...dataplane.queries import check_unload, load_override, serving_versions, tensors
from ...dataplane.stats import statistics
from ...errors import AserveError, InvalidInput, ModelNotFound
from ...inference import InferCall
from ...logs import AccessLogger
from ...protocol.grpc import protos
from ...protocol.grpc.codec import GRPC, Wire
from ..access import ADMIN, API, OPEN, Level
from ..admin import apply_trace_setting, current_trace_setting
from ..app import App
from ..connection import MAX_WAITING
from ..spans import grpc_span
from ..v2 import EXTENSIONS
from .status import Answered, Status, status_of

log = logging.getLogger("aserve.server")

SERVICE = protos.SERVICE
INFER = f"/{SERVICE}/ModelInfer"
STREAM = f"/{SERVICE}/ModelStreamInfer"

# what grpc raises on an operation of a call that already ended (a write to a client that left)
CALL_ENDED: type[Exception] = cygrpc.ExecuteBatchError

Handler = Callable[[Any, grpc.aio.ServicerContext, dict[str, str]], Awaitable[Any]]
Unary = Callable[[bytes, grpc.aio.ServicerContext], Awaitable[Any]]
# a front loop's way to the host: (method, request bytes, metadata) -> the host's answer (GrpcFront.answer)
Relay = Callable[[str, bytes, dict[str, str]], Awaitable[dict[str, Any]]]
# the unary methods a front loop answers itself (and ModelStreamInfer), and those it answers for
# a model it serves (`Methods.served_here`): the others go to the host
LOCAL = ("ModelInfer", "ServerLive", "ServerReady")
SERVED_HERE = ("ModelReady", "ModelConfig")
Named = tuple[str, str, str]  # a request's model name, version and id
REMAINING = "aserve-remaining-s"  # a relayed infer call's deadline: seconds left when the front relayed it


class GrpcStats:
    """Calls answered by the gRPC front, by method and status code (`aserve_grpc_requests_total`);
    a stream's requests are counted one by one under ModelStreamInfer."""

    __slots__ = ("calls", "held")

    def __init__(self) -> None:
        self.calls: dict[tuple[str, str], int] = {}
        self.held = 0  # streams reading no requests now: MAX_WAITING of theirs wait to be answered

    def count(self, method: str, code: grpc.StatusCode) -> None:
        key = (method, code.name)
        self.calls[key] = self.calls.get(key, 0) + 1


def metadata(context: grpc.aio.ServicerContext) -> dict[str, str]:
    """The call's metadata as lower-case names (binary `-bin` values left out)."""
    return {k.lower(): v for k, v in context.invocation_metadata() or () if isinstance(v, str)}


def authorization(invocation_metadata: Any) -> str | None:
    """The `authorization` value of a call's metadata (the last, as `metadata` keeps it)."""
    found = None
    for key, value in invocation_metadata or ():
        if isinstance(value, str) and key.lower() == "authorization":
            found = value
    return found


def parse(kind: Any, raw: bytes) -> Any:
    """The `kind` message in `raw`; InvalidInput (INVALID_ARGUMENT) when it is not one."""
    try:
        return kind.FromString(raw)
    except DecodeError as e:
        name = kind.DESCRIPTOR.full_name
        raise InvalidInput(f"the request is not a valid {name} message (protobuf: {e})") from None


class Methods:
    """The service's methods, bound to a server's App."""

    def __init__(self, app: App, stats: GrpcStats, access_log: AccessLogger | None, *,
                 relay: Relay | None = None) -> None:
        self.app = app
        self.plane = app.plane
        self.stats = stats
        self.access_log = access_log
        self.relay = relay  # a front loop's: the methods it does not answer itself go to the host
        # every unary method: name -> (its access level, its handler, its request's message type)
        self.unaries: dict[str, tuple[Level, Handler, Any]] = {
            "ServerLive": (OPEN, self.server_live, protos.ServerLiveRequest),
            "ServerReady": (OPEN, self.server_ready, protos.ServerReadyRequest),
            "ModelReady": (OPEN, self.model_ready, protos.ModelReadyRequest),
            "ServerMetadata": (API, self.server_metadata, protos.ServerMetadataRequest),
            "ModelMetadata": (API, self.model_metadata, protos.ModelMetadataRequest),
            "ModelInfer": (API, self.model_infer, None),  # its bytes: the codec reads them (`Wire`)
            "ModelConfig": (API, self.model_config, protos.ModelConfigRequest),
            "ModelStatistics": (API, self.model_statistics, protos.ModelStatisticsRequest),
            "RepositoryIndex": (ADMIN, self.repository_index, protos.RepositoryIndexRequest),
            "RepositoryModelLoad": (ADMIN, self.repository_load, protos.RepositoryModelLoadRequest),
            "RepositoryModelUnload": (ADMIN, self.repository_unload, protos.RepositoryModelUnloadRequest),
            "TraceSetting": (ADMIN, self.trace_setting, protos.TraceSettingRequest),
        }
        self.host = ""  # host:port the front listens on (what a trace's server span names)
        self.readers: set[asyncio.Task[None]] = set()  # each open stream's reading of its requests

    def stop_reading(self) -> None:
        """Shutting down: every stream takes no more requests, answers those it took, and ends."""
        for reader in list(self.readers):
            reader.cancel()

    # ---- the one wrapper every unary method runs in ----

    def unary(self, name: str, kind: Any, handler: Handler) -> Unary:
        """The method `name` as grpc serves it: the message (`kind`) parsed from its bytes, the
        handler's answer, or what it raised as a status. The token was checked before
        (`Service.service`)."""
        method = f"/{SERVICE}/{name}"

        async def call(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
            start = time.perf_counter()
            code = grpc.StatusCode.OK
            size = 0
            counted = False
            try:
                request = raw if kind is None else parse(kind, raw)  # None: relayed as it came
                # the metadata are read only when a trace may be in them
                md = metadata(context) if self.plane.tracer is not None else {}
                response = await handler(request, context, md)
                if self.access_log is not None:
                    size = len(response) if isinstance(response, bytes) else response.ByteSize()
                return response
            except asyncio.CancelledError:
                code = grpc.StatusCode.CANCELLED  # the client went away, or its deadline passed
                raise
            except Exception as exc:  # noqa: BLE001 - answered with its status
                status = status_of(exc, self.app.policy, method)
                code = status.code
                if status.trailers:
                    context.set_trailing_metadata(status.trailers)
                counted = True
                self._done(name, code, size, start, context)  # counted before the client hears it
                await context.abort(status.code, status.message)
            finally:
                if not counted:
                    self._done(name, code, size, start, context)

        return call

    def served_here(self, name: str, handler: Handler) -> Handler:
        """The method `name` on a front loop: its own answer for a model it serves, the host's
        for any other (loading, not ready, unknown)."""
        relayed = self.relayed(name)

        async def call(request: Any, context: grpc.aio.ServicerContext, md: dict[str, str]) -> Any:
            try:
                return await handler(request, context, md)
            except ModelNotFound:
                return await relayed(request if isinstance(request, bytes) else request.SerializeToString(),
                                     context, md)

        return call

    def relayed(self, name: str) -> Handler:
        """The method `name` on a front loop, answered by the host (`answer` there): the
        request's bytes go over the loop's channel, the response's bytes come back, or its
        status raised (`Answered`). Run by `unary`, so counted and logged here."""
        relay = self.relay
        assert relay is not None

        async def call(raw: bytes, context: grpc.aio.ServicerContext, md: dict[str, str]) -> bytes:
            return answered(await relay(name, raw, md))

        return call

    async def answer(self, name: str, raw: bytes, md: dict[str, str]) -> dict[str, Any]:
        """The host's answer to a unary method a front loop relayed (`relayed`): the response's
        bytes, or the status what it raised maps to. The front checked the token, and counts it."""
        try:
            _, handler, kind = self.unaries[name]
            response = await handler(raw if kind is None else parse(kind, raw), None, md)  # no call here: no context
            return {"code": "OK", "body": _serialize(response)}
        except Exception as exc:  # noqa: BLE001 - answered with its status
            status = status_of(exc, self.app.policy, f"/{SERVICE}/{name}")
            return {"code": status.code.name, "message": status.message,
                    "trailers": [list(t) for t in status.trailers or ()]}

    def refusal(self, name: str, exc: AserveError) -> grpc.RpcMethodHandler:
        """The handler of a call to `name` refused before its message is read (`exc`: why). It
        is request-streaming whatever the method, because a gRPC server reads a unary call's message
        before it calls the handler; this one answers without reading."""
        status = status_of(exc, self.app.policy, f"/{SERVICE}/{name}")

        async def refuse(requests: Any, context: grpc.aio.ServicerContext) -> None:
            self._done(name, status.code, 0, time.perf_counter(), context)  # counted before the client hears it
            await context.abort(status.code, status.message)

        return grpc.stream_unary_rpc_method_handler(refuse)

    def _done(self, name: str, code: grpc.StatusCode, size: int, start: float,
              context: grpc.aio.ServicerContext) -> None:
        self.stats.count(name, code)
        if self.access_log is not None:
            self.access_log.rpc(context.peer(), f"/{SERVICE}/{name}", code.value[0], code.name, size,
                                time.perf_counter() - start)

    # ---- health and metadata ----

    async def server_live(self, request: Any, context: grpc.aio.ServicerContext, md: dict[str, str]) -> Any:
        return protos.ServerLiveResponse(live=True)

    async def server_ready(self, request: Any, context: grpc.aio.ServicerContext, md: dict[str, str]) -> Any:
        return protos.ServerReadyResponse(ready=self.app.readiness().ready)

    async def model_ready(self, request: Any, context: grpc.aio.ServicerContext, md: dict[str, str]) -> Any:
        handle = self.plane.model(request.name, request.version or None)
        return protos.ModelReadyResponse(ready=handle.ready)



    async def server_metadata(self, request: Any, context: grpc.aio.ServicerContext, md: dict[str, str]) -> Any:
        return protos.ServerMetadataResponse(name="aserve", version=__version__, extensions=EXTENSIONS)

    async def model_metadata(self, request: Any, context: grpc.aio.ServicerContext, md: dict[str, str]) -> Any:
        handle = self.plane.model(request.name, request.version or None)
        inputs, outputs = tensors(handle)
        return protos.ModelMetadataResponse(
            name=handle.name, versions=serving_versions(self.plane, handle), platform="aserve",
            inputs=[{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)} for s in inputs],
            outputs=[{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)} for s in outputs],
        )

    async def model_config(self, request: Any, context: grpc.aio.ServicerContext, md: dict[str, str]) -> Any:
        """Triton's model configuration, from the version's config.toml and what its load reports."""
        handle = self.plane.model(request.name, request.version or None)
        config = handle.config
        batch = config.max_batch_size
        inputs, outputs = tensors(handle)

        def dims(shape: Any) -> list[int]:
            return list(shape[1:] if batch > 0 and shape else shape)

        parameters = self.app.policy.redactor().value(msgspec.to_builtins(config.parameters))
        message = protos.ModelConfigResponse()
        out = message.config
        out.name = handle.name
        out.platform = "aserve"
        out.backend = "python"
        out.max_batch_size = batch
        for s in inputs:
            out.input.add(name=s.name, data_type=_data_type(s.datatype), dims=dims(s.shape))
        for s in outputs:
            out.output.add(name=s.name, data_type=_data_type(s.datatype), dims=dims(s.shape))
        interpreters = handle.info.interpreters if handle.info else (config.interpreters or 0)
        out.instance_group.add(name=handle.name, count=interpreters, kind=2)  # KIND_CPU
        if batch > 0:
            out.dynamic_batching.max_queue_delay_microseconds = int(config.batching.max_queue_delay_ms * 1000)
        for key, value in parameters.items():
            out.parameters[key].string_value = value if isinstance(value, str) else json.dumps(value)
        return message

    async def model_statistics(self, request: Any, context: grpc.aio.ServicerContext, md: dict[str, str]) -> Any:
        fronts = await self.app.loops.stats() if self.app.loops is not None else None  # what every loop counted
        rows = statistics(self.plane.registry, request.name or None, request.version or None, fronts)
        return json_format.ParseDict({"model_stats": rows}, protos.ModelStatisticsResponse(),
                                     ignore_unknown_fields=True)

    # ---- the repository and trace settings ----

    async def repository_index(self, request: Any, context: grpc.aio.ServicerContext, md: dict[str, str]) -> Any:
        message = protos.RepositoryIndexResponse()
        for row in self.plane.registry.index(ready_only=request.ready):
            message.models.add(name=row["name"], version=str(row.get("version") or ""), state=row.get("state", ""),
                               reason=self.app.policy.redact(row.get("reason") or ""))
        return message

    async def repository_load(self, request: Any, context: grpc.aio.ServicerContext, md: dict[str, str]) -> Any:
        """Load or reload a model; parameter `config` (a JSON object of config.toml fields, as a
        string or bytes) is laid over its config.toml until the next load."""
        parameters = {key: getattr(value, value.WhichOneof("parameter_choice") or "string_param")
                      for key, value in request.parameters.items()}
        override = load_override(request.model_name, parameters)
        if not request.model_name:
            raise InvalidInput("model_name: expected the name of a model folder in the repository, got ''")
        await self.plane.load(request.model_name, override)
        return protos.RepositoryModelLoadResponse()

    async def repository_unload(self, request: Any, context: grpc.aio.ServicerContext, md: dict[str, str]) -> Any:
        check_unload(request.parameters)
        await self.plane.unload(request.model_name)
        return protos.RepositoryModelUnloadResponse()

    async def trace_setting(self, request: Any, context: grpc.aio.ServicerContext, md: dict[str, str]) -> Any:
        """Triton's trace settings (trace_level, trace_rate), server-wide as over HTTP."""
        tracer = self.plane.tracer
        if request.model_name:
            self.plane.model(request.model_name)  # NOT_FOUND for an unknown model
        wanted: dict[str, Any] = {}
        for key, value in request.settings.items():
            values = list(value.value)
            if values:
                wanted[key] = values if key == "trace_level" else values[0]
        if wanted:
            if tracer is None:
                raise InvalidInput("trace setting: tracing is off in this server; start it with "
                                   "OTEL_EXPORTER_OTLP_ENDPOINT set or [tracing] enabled = true")
            apply_trace_setting(tracer, wanted)
        message = protos.TraceSettingResponse()
        for key, value in msgspec.to_builtins(current_trace_setting(tracer)).items():
            message.settings[key].value.extend(value if isinstance(value, list) else [str(value)])
        return message

    # ---- infer ----

    def _call(self, model: str, version: str, body: Any, context: grpc.aio.ServicerContext | None,
              md: dict[str, str], route: str) -> InferCall:
        """The infer call of a request (`body`: a `Wire`, or the message decoded); its deadline
        the client's (for a call a front relayed, what was left of it then)."""
        if context is not None:
            remaining = context.time_remaining()
        else:
            remaining = float(md[REMAINING]) if REMAINING in md else None
        return InferCall(
            codec=GRPC, model=model, version=version or None, body=body,
            headers=md, received=time.monotonic(), route=route.lstrip("/"), host=self.host,
            timeout_ms=None if remaining is None else max(remaining, 0.0) * 1000.0, front="grpc",
            describe=grpc_span,
        )

    async def model_infer(self, raw: bytes, context: grpc.aio.ServicerContext, md: dict[str, str]) -> Any:
        """ModelInfer: the message's bytes to the codec, the answer's bytes (or message) back."""
        wire = Wire.of(raw)
        if wire.split is not None:
            call = self._call(wire.split[0], wire.split[1], wire, context, md, INFER)
        else:  # one grpc_split cannot read: decoded in full, which names what is wrong
            message = wire.parsed()
            call = self._call(message.model_name, message.model_version, message, context, md, INFER)
        try:
            handle = self.plane.model(call.model, call.version)
        except ModelNotFound:
            if self.relay is None:
                raise
            return await self._infer_on_host(raw, md, None if context is None else context.time_remaining())
        # the message is whole: admission runs once, in submit, on what the request holds
        answer = await self.plane.infer(call, handle=handle)
        return answer.chunks[0]

    def submit_infer(self, raw: bytes, context: Any) -> bool:
        """ModelInfer without a task, for a server whose calls can be answered later
        (`h2.Call.answer` and `fail`): `model_infer` and `unary`'s counting and logging, the
        answer told by the data plane's `Pending.then`. False leaves the call to `unary`: a
        message grpc_split cannot read (the full decoder names what is wrong), or a model a
        front loop does not serve (the host answers it)."""
        start = time.perf_counter()
        wire = Wire.of(raw)
        if wire.split is None:
            return False
        md = metadata(context) if self.plane.tracer is not None else {}
        try:
            call = self._call(wire.split[0], wire.split[1], wire, context, md, INFER)
            try:
                handle = self.plane.model(call.model, call.version)
            except ModelNotFound:
                if self.relay is not None:
                    return False
                raise
            pending = self.plane.submit(call, handle=handle)
        except Exception as exc:  # noqa: BLE001 - answered with its status
            self._failed(exc, start, context)
            return True

        def cancelled() -> None:
            pending.drop()
            self._done("ModelInfer", context.code, 0, start, context)

        def done(answer: Any, error: BaseException | None) -> None:
            context.on_cancel = None
            if error is not None:
                return self._failed(error, start, context)
            response = answer.chunks[0]
            self._done("ModelInfer", grpc.StatusCode.OK,
                       (len(response) if isinstance(response, bytes) else response.ByteSize())
                       if self.access_log is not None else 0, start, context)
            context.answer(response)

        context.on_cancel = cancelled
        pending.then(done)
        return True

    def _failed(self, exc: BaseException, start: float, context: Any) -> None:
        status = status_of(exc, self.app.policy, INFER)
        self._done("ModelInfer", status.code, 0, start, context)  # counted before the client hears it
        context.fail(status.code, status.message, status.trailers or ())

    async def _infer_on_host(self, raw: bytes, md: dict[str, str], remaining: float | None) -> Any:
        """A front loop's infer request for a model it does not serve (one only the host's loop
        serves, one loading, or none): the host's answer's bytes, or its status raised (Answered)."""
        assert self.relay is not None
        if remaining is not None:
            md = {**md, REMAINING: repr(max(remaining, 0.0))}
        return answered(await self.relay("ModelInfer", raw, md))

    async def model_stream_infer(self, requests: Any, context: grpc.aio.ServicerContext) -> None:
        """Each request of the stream is queued as it arrives and answered as soon as its batch
        ran, with its id; a request that fails (a malformed message too) is answered with its
        error and the stream goes on. While MAX_WAITING requests wait for their answers to be
        written, the stream reads no more: a client that does not read its answers holds at
        most that many (grpc's flow control then holds the client's writes). The token was
        checked before (`Service.service`)."""
        start = time.perf_counter()
        code = grpc.StatusCode.OK
        md = metadata(context)
        answers: asyncio.Queue[Any] = asyncio.Queue()
        waiting = 0  # requests read whose answers are not written yet
        room = asyncio.Event()  # set when fewer than MAX_WAITING wait: reading goes on
        reading = True
        pendings: set[Any] = set()
        relayed: set[asyncio.Future[None]] = set()  # requests the host answers (`_stream_on_host`)

        def answered(named: Named, pending: Any) -> Callable[[Any, BaseException | None], None]:
            def done(answer: Any, error: BaseException | None) -> None:
                pendings.discard(pending)
                if error is not None:
                    answers.put_nowait(self._stream_error(named, error))
                else:
                    answers.put_nowait((grpc.StatusCode.OK, _in_stream(answer.chunks[0])))
            return done

        async def read() -> None:
            nonlocal reading, waiting
            try:
                async for raw in requests:
                    waiting += 1
                    named = None  # the request's model, version and id, once read
                    try:
                        wire = Wire.of(raw)
                        if wire.split is not None:
                            named, body = wire.split[:3], wire
                        else:  # one grpc_split cannot read: decoded in full, which names what is wrong
                            body = wire.parsed()
                            named = (body.model_name, body.model_version, body.id)
                        pending = self.plane.submit(self._call(named[0], named[1], body, context, md, STREAM))
                    except ModelNotFound as exc:
                        if self.relay is None or named is None:
                            answers.put_nowait(self._stream_error(named, exc))
                        else:  # a model this front loop does not serve: the host answers it
                            future = asyncio.ensure_future(self._stream_on_host(raw, named, md, context, answers))
                            relayed.add(future)
                            future.add_done_callback(relayed.discard)
                    except Exception as exc:  # noqa: BLE001 - this request fails alone
                        answers.put_nowait(self._stream_error(named, exc))
                    else:
                        pendings.add(pending)
                        pending.then(answered(named, pending))
                    if waiting >= MAX_WAITING:
                        self.stats.held += 1
                        try:
                            while waiting >= MAX_WAITING:
                                room.clear()
                                await room.wait()
                        finally:
                            self.stats.held -= 1
            finally:
                reading = False
                answers.put_nowait(None)  # wakes the writer to see the stream's end

        reader = asyncio.get_running_loop().create_task(read())
        self.readers.add(reader)
        try:
            while reading or waiting:
                item = await answers.get()
                if item is None:
                    continue
                self.stats.count("ModelStreamInfer", item[0])
                try:
                    await context.write(item[1])
                except CALL_ENDED:  # the client cancelled or went away: nothing failed, nothing more is written
                    raise asyncio.CancelledError from None  # grpc ends a cancelled handler without a status
                waiting -= 1
                if waiting < MAX_WAITING:
                    room.set()
            error = None if reader.cancelled() else reader.exception()
            if error is not None:
                raise error  # reading the stream failed
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        finally:
            reader.cancel()
            self.readers.discard(reader)
            for pending in list(pendings):
                pending.drop()
            for future in relayed:
                future.cancel()
            if self.access_log is not None:
                self.access_log.rpc(context.peer(), STREAM, code.value[0], code.name, 0,
                                    time.perf_counter() - start)

    async def _stream_on_host(self, raw: bytes, named: Named, md: dict[str, str],
                              context: grpc.aio.ServicerContext, answers: asyncio.Queue[Any]) -> None:
        """A stream's request the host answers (`_infer_on_host`), put among the stream's answers."""
        try:
            response = await self._infer_on_host(raw, md, context.time_remaining())
        except Exception as exc:  # noqa: BLE001 - this request fails alone
            answers.put_nowait(self._stream_error(named, exc))
        else:
            answers.put_nowait((grpc.StatusCode.OK, _in_stream(response)))

    def _stream_error(self, named: Named | None, exc: BaseException) -> tuple[grpc.StatusCode, Any]:
        """A stream's answer to one request that failed: its status's message, and its model,
        version and id (none for a message that could not be read)."""
        status = status_of(exc, self.app.policy, STREAM)
        fields = {} if named is None else dict(zip(("model_name", "model_version", "id"), named, strict=True))
        return status.code, protos.ModelStreamInferResponse(
            error_message=status.message, infer_response=protos.ModelInferResponse(**fields))

    # ---- the handler grpc.aio serves ----

    def handler(self) -> grpc.GenericRpcHandler:
        """Every method, each with the access level its token is checked against. Handlers take
        the request's bytes (no request_deserializer): the methods parse them."""
        methods = {}
        for name, (level, fn, kind) in self.unaries.items():
            if self.relay is not None and name in SERVED_HERE:
                fn = self.served_here(name, fn)
            elif self.relay is not None and name not in LOCAL:  # the host answers it, in bytes
                fn, kind = self.relayed(name), None
            behavior = self.unary(name, kind, fn)
            if name == "ModelInfer":  # a server that can answer it later (h2.py) spends no task on it
                behavior.submit = self.submit_infer  # type: ignore[attr-defined]
            handler = grpc.unary_unary_rpc_method_handler(behavior, response_serializer=_serialize)
            methods[f"/{SERVICE}/{name}"] = (name, level, handler)
        methods[STREAM] = ("ModelStreamInfer", API, grpc.stream_stream_rpc_method_handler(
            self.model_stream_infer, response_serializer=_serialize))
        return Service(self, methods)


class Service(grpc.GenericRpcHandler):  # type: ignore[misc]  # grpc ships no type information
    """`inference.GRPCInferenceService` as a gRPC server finds its methods: `service` is asked for
    each call's handler when the call arrives, with its metadata and before its message is
    read, so the token is checked there; a call without the method's token gets a handler
    that refuses it without reading the message (`Methods.refusal`)."""

    def __init__(self, methods: Methods, table: dict[str, tuple[str, Level, grpc.RpcMethodHandler]]) -> None:
        self.methods = methods
        self.access = methods.app.access
        self.table = table  # /Service/Method -> (its name, its access level, its handler)

    def service_name(self) -> str:
        return SERVICE

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        found = self.table.get(handler_call_details.method)
        if found is None:
            return None  # another service's method: grpc asks the next handler
        name, level, handler = found
        if level == OPEN or not self.access.guards_anything:
            return handler
        try:
            self.access.check_credential(authorization(handler_call_details.invocation_metadata), level)
        except AserveError as exc:  # Unauthorized, Forbidden
            return self.methods.refusal(name, exc)
        return handler


def _serialize(message: Any) -> bytes:
    if isinstance(message, bytes):  # the host's answer to a relayed call
        return message
    data: bytes = message.SerializeToString()
    return data


def _in_stream(response: Any) -> Any:
    """A ModelStreamInferResponse holding `response` (a ModelInferResponse, or its bytes): as
    bytes, its field 2 written around them."""
    if not isinstance(response, bytes):
        return protos.ModelStreamInferResponse(infer_response=response)
    size, n = bytearray(), len(response)
    while True:
        size.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return b"\x12" + bytes(size) + response


def answered(answer: dict[str, Any]) -> bytes:
    """The response's bytes of the host's answer to a relayed call (`Methods.answer`), or its
    status raised (Answered)."""
    if answer["code"] != "OK":
        trailers = tuple((str(k), str(v)) for k, v in answer.get("trailers") or ())
        raise Answered(Status(grpc.StatusCode[answer["code"]], answer["message"], trailers))
    body: bytes = answer["body"]
    return body


_DATA_TYPES = {name: index for index, name in enumerate(
    ("INVALID", "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
     "FP64", "BYTES", "BF16"))}


def _data_type(datatype: str) -> int:
    """Triton's DataType enum value of a V2 datatype (BYTES is TYPE_STRING)."""
    return _DATA_TYPES.get(datatype, 0)
