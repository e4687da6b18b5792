"""docker/compose.yaml, docker/prometheus.yml and Grafana's provisioning, read with PyYAML: the
services, their ports and the names they reach each other by agree, and with the Dockerfile."""

from __future__ import annotations

import pathlib
import re
from urllib.parse import urlsplit

import pytest
import yaml

from aserve.config import FIELDS

from .conftest import DOCKER, ROOT, Dockerfile, container_ports, published
from .test_dockerfile import env

SERVICES = {"aserve", "jaeger", "prometheus", "grafana", "locust"}
HOST_PORTS = {"aserve": 8000, "aserve-grpc": 8001, "jaeger": 16686, "prometheus": 9090, "grafana": 3000, "locust": 8089}


def mounts(service: dict) -> dict[str, pathlib.Path]:
    """{container path: host path} of a service's bind mounts (relative to docker/, as compose reads them)."""
    out = {}
    for volume in service.get("volumes", ()):
        source, target = str(volume).split(":")[:2]
        out[target] = (DOCKER / source).resolve()
    return out


def mounted(service: dict, container_path: str) -> pathlib.Path:
    """The host path a container path of `service` is, through its bind mounts."""
    for target, source in mounts(service).items():
        if container_path == target or container_path.startswith(target.rstrip("/") + "/"):
            return source / container_path[len(target):].lstrip("/")
    raise AssertionError(f"{container_path} is not under any volume of the service")


def endpoint(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname and parts.port, url
    return parts.hostname, parts.port


def reaches(compose: dict, host: str, port: int) -> None:
    """`host:port` is a service of the compose file listening on that port inside the network."""
    assert host in compose["services"], f"{host} is not a compose service"
    assert port in container_ports(compose["services"][host]), f"{host} does not listen on {port}"


def test_services_and_host_ports(compose: dict) -> None:
    services = compose["services"]
    assert set(services) == SERVICES
    for name, port in HOST_PORTS.items():
        name = name.removesuffix("-grpc")
        assert port in published(services[name]).values(), f"{name} does not publish {port}"
    every = [p for s in services.values() for p in published(s).values()]
    assert sorted(every) == sorted(HOST_PORTS.values())  # one host port each, no clashes
    for name, service in services.items():
        for source in mounts(service).values():
            assert source.exists(), f"{name} mounts {source}, which does not exist"


def test_aserve_is_the_image_on_the_dockerfile_port(compose: dict, dockerfile: Dockerfile) -> None:
    service = compose["services"]["aserve"]
    build = service["build"]
    assert (DOCKER / build["context"]).resolve() == ROOT
    assert (ROOT / build["dockerfile"]).resolve() == DOCKER / "Dockerfile"
    port = int(env(dockerfile.final)["ASERVE_PORT"])
    grpc_port = int(env(dockerfile.final)["ASERVE_GRPC_PORT"])
    assert dockerfile.final.all("EXPOSE") == [f"{port} {grpc_port}"]
    assert published(service) == {port: 8000, grpc_port: 8001}
    for key in service.get("environment", {}):
        if key.startswith("ASERVE_"):  # overrides of the image's settings must be settings
            assert key.removeprefix("ASERVE_").lower() in FIELDS, key


def test_traces_go_to_jaeger_over_otlp_http(compose: dict) -> None:
    services = compose["services"]
    environment = services["aserve"]["environment"]
    assert environment["OTEL_SERVICE_NAME"] == "aserve"
    host, port = endpoint(environment["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert (host, port) == ("jaeger", 4318)  # OTLP over HTTP, what aserve's exporter speaks
    assert environment.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf") == "http/protobuf"
    reaches(compose, host, port)
    jaeger = services["jaeger"]
    assert jaeger["image"].startswith("jaegertracing/all-in-one:")
    assert str(jaeger["environment"]["COLLECTOR_OTLP_ENABLED"]).lower() == "true"
    assert published(jaeger) == {16686: 16686}  # the UI; OTLP stays inside the network
    assert "jaeger" in services["aserve"]["depends_on"]


def test_prometheus_scrapes_aserve_metrics(compose: dict, dockerfile: Dockerfile) -> None:
    service = compose["services"]["prometheus"]
    config_path = mounted(service, "/etc/prometheus/prometheus.yml")
    assert config_path == DOCKER / "prometheus.yml"
    config = yaml.safe_load(config_path.read_text())
    (job,) = config["scrape_configs"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    assert job.get("scheme", "http") == "http"
    targets = [t for group in job["static_configs"] for t in group["targets"]]
    assert targets == ["aserve:8000"]
    host, _, port = targets[0].partition(":")
    reaches(compose, host, int(port))
    assert int(port) == int(env(dockerfile.final)["ASERVE_PORT"])
    assert published(service) == {9090: 9090}


def test_grafana_provisions_the_prometheus_datasource_and_the_dashboard(compose: dict) -> None:
    service = compose["services"]["grafana"]
    provisioning = mounted(service, "/etc/grafana/provisioning")
    assert provisioning == DOCKER / "grafana" / "provisioning"
    (datasources,) = (yaml.safe_load(p.read_text()) for p in (provisioning / "datasources").glob("*.y*ml"))
    source, traces = datasources["datasources"]
    assert source["type"] == "prometheus" and source["access"] == "proxy"
    # an exemplar's trace id (aserve writes it as trace_id) opens the trace in the Jaeger datasource
    (link,) = source["jsonData"]["exemplarTraceIdDestinations"]
    assert link == {"name": "trace_id", "datasourceUid": traces["uid"]} and traces["type"] == "jaeger"
    assert endpoint(traces["url"]) == ("jaeger", 16686)
    reaches(compose, "jaeger", 16686)
    assert "--enable-feature=exemplar-storage" in compose["services"]["prometheus"]["command"]
    host, port = endpoint(source["url"])
    assert (host, port) == ("prometheus", 9090)
    reaches(compose, host, port)
    scrape = yaml.safe_load((DOCKER / "prometheus.yml").read_text())["global"]["scrape_interval"]
    assert source["jsonData"]["timeInterval"] == scrape  # $__rate_interval spans enough scrapes

    (providers,) = (yaml.safe_load(p.read_text()) for p in (provisioning / "dashboards").glob("*.y*ml"))
    (provider,) = providers["providers"]
    assert provider["type"] == "file"
    folder = mounted(service, provider["options"]["path"])
    assert folder == DOCKER / "grafana" / "dashboards"
    assert (folder / "aserve.json").is_file()
    home = service["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert mounted(service, home) == folder / "aserve.json"
    assert published(service) == {3000: 3000}


def test_locust_loads_aserve_only_when_asked(compose: dict, dockerfile: Dockerfile) -> None:
    service = compose["services"]["locust"]
    assert service["profiles"] == ["load"]  # `up` leaves it out; `--profile load` brings it
    environment = service["environment"]
    locustfile = mounted(service, environment["LOCUST_LOCUSTFILE"])
    assert locustfile == ROOT / "loadtests" / "locustfile.py"
    assert (locustfile.parent / "scenario.py").is_file()  # its import, beside it in the mount
    host, port = endpoint(environment["LOCUST_HOST"])
    assert (host, port) == ("aserve", int(env(dockerfile.final)["ASERVE_PORT"]))
    reaches(compose, host, port)
    command = service["command"]
    assert "--headless" in command
    run_time = command[command.index("--run-time") + 1]
    assert re.fullmatch(r"\d+[smh]", run_time)  # bounded
    assert published(service) == {8089: 8089}  # the web UI, when run without --headless
    # it starts once aserve answers ready: the image's HEALTHCHECK says when
    assert service["depends_on"]["aserve"]["condition"] == "service_healthy"
    assert dockerfile.final.all("HEALTHCHECK")


@pytest.mark.parametrize("service", sorted(SERVICES - {"aserve"}))
def test_third_party_images_are_pinned(compose: dict, service: str) -> None:
    image = compose["services"][service]["image"]
    _, _, tag = image.partition(":")
    assert tag and tag != "latest" and re.match(r"v?\d+\.\d+", tag), image
