"""What a sampled request's server span says of the transport it came by (OpenTelemetry's
semantic conventions): its name and attributes, which the front hands the data plane with
the call (`InferCall.describe`); the plane adds the model's own and keeps them in the
tracer's table, once per route, model and address."""

from __future__ import annotations

from typing import Any

from ..inference import InferCall


def address(host: str) -> tuple[str, int | None]:
    """The server's address and port as a request's Host (or the listener) names them."""
    name, _, port = host.rpartition(":") if ":" in host else (host, "", "")
    return name or host, int(port) if port.isdigit() else None


def _with_port(attributes: dict[str, Any], port: int | None) -> dict[str, Any]:
    if port is not None:
        attributes["server.port"] = port
    return attributes


def http_span(call: InferCall) -> tuple[str, dict[str, Any]]:
    """An HTTP request's: `POST /route`, its method, route, path and the server's address."""
    host, port = address(call.host)
    version = call.version or ""
    path = call.route.replace("{model}", call.model).replace("{version}", version).replace("{label}", version)
    return f"POST {call.route}", _with_port({
        "http.request.method": "POST", "http.route": call.route, "url.scheme": "http", "url.path": path,
        "server.address": host, "network.protocol.version": "1.1"}, port)


def grpc_span(call: InferCall) -> tuple[str, dict[str, Any]]:
    """A gRPC call's: the method's full name (its route, package.Service/Method), the service and
    the method, the server's address."""
    host, port = address(call.host)
    service, _, method = call.route.rpartition("/")
    return call.route, _with_port({
        "rpc.system": "grpc", "rpc.service": service, "rpc.method": method, "server.address": host,
        "network.protocol.version": "2"}, port)
