"""deploy/: KServe's runtimes and InferenceService, and the Helm chart, validated without a cluster.

- core resources (Deployment, Service, HPA, PodDisruptionBudget) against Kubernetes' own
  OpenAPI schemas, strictly (an unknown field is an error), with `kubernetes-validate`;
- KServe's ServingRuntime, ClusterServingRuntime and InferenceService, and Prometheus
  Operator's ServiceMonitor, against the `openAPIV3Schema` of their published CRDs, kept in
  deploy/kserve/schemas/ and deploy/helm/schemas/ (README.md there: source, tag, commit),
  with `jsonschema`, unknown fields rejected as well;
- the chart rendered by Helm's own engine (Helm's Go SDK in `helm-python-sdk`, run in a
  subprocess) for several sets of values, linted, and the values it must refuse refused;
- what the files say checked against the project: the container arguments parsed by
  `aserve serve`'s own parser (interpreters = requested CPUs, drain + shutdown timeout below
  the termination grace period, port), the image's port and user, the probes' paths, the
  preStop hook's code, and the HPA metric's series exported by a real server.

tests/deploy/test_k8s_serve.py runs the server side: KServe's /mnt/models layout served by
the runtime's own arguments, the drain, and a rolling update behind a proxy.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import pathlib
import re
import subprocess
import sys
import textwrap
from typing import Any

import aiohttp
import jsonschema
import kubernetes_validate
import pytest
import yaml

from aserve.cli import build_parser, settings_from_args
from aserve.config import ServerSettings

from .conftest import DEPLOY, Dockerfile
from .test_dashboard import exported, metric_names

KSERVE = DEPLOY / "kserve"
CHART = DEPLOY / "helm" / "aserve"
ADAPTER = DEPLOY / "helm" / "prometheus-adapter-values.yaml"
READY, LIVE = "/v2/health/ready", "/v2/health/live"
MAX_INTERPRETERS = 15  # glibc: 16 link-map namespaces, the base one included
KUBERNETES_VERSIONS = ("1.25.0", kubernetes_validate.latest_version())  # the chart's kubeVersion floor, newest
CORE_KINDS = {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"}

# The published CRDs kept in the repository: file -> git blob id of the file at its source
# (deploy/kserve/schemas/README.md and deploy/helm/schemas/README.md name the source).
CRDS = {
    KSERVE / "schemas" / "serving.kserve.io_servingruntimes.yaml": "59deb0d14aed7be7edfd32ca0577f9ba789fa747",
    KSERVE / "schemas" / "serving.kserve.io_clusterservingruntimes.yaml": "1ce0a2e5b3d7c05192f7c817eff4d614a80cb432",
    KSERVE / "schemas" / "serving.kserve.io_inferenceservices.yaml": "1e37d05b7a741eb40b9eb01c378dc9dc80eab3d9",
    DEPLOY / "helm" / "schemas" / "monitoring.coreos.com_servicemonitors.yaml":
        "f5736255990a0e152851fadb55f84d6fd0f91d87",
}

Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the InferenceService CRD is 2 MB of YAML


def documents(path: pathlib.Path) -> list[dict]:
    return [d for d in yaml.load_all(path.read_text(), Loader=Loader) if d]


def one(path: pathlib.Path) -> dict:
    docs = documents(path)
    assert len(docs) == 1, f"{path}: expected one document, got {len(docs)}"
    return docs[0]


# ---- CRD schemas ----


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def strict(schema: Any) -> Any:
    """The schema with unknown fields rejected: the API server prunes them silently, which
    would hide a misspelt field. Objects that list their properties and allow nothing else
    (no additionalProperties, no x-kubernetes-preserve-unknown-fields) get
    additionalProperties: false."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if ("properties" in schema and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@functools.cache
def crd_validators() -> dict[tuple[str, str], jsonschema.protocols.Validator]:
    """(apiVersion, kind) -> a validator of that served version's openAPIV3Schema."""
    out = {}
    for path in CRDS:
        crd = one(path)
        assert crd["kind"] == "CustomResourceDefinition", path
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version.get("served"):
                schema = strict(version["schema"]["openAPIV3Schema"])
                out[(f"{group}/{version['name']}", kind)] = jsonschema.Draft4Validator(schema)
    return out


def validate_custom(doc: dict) -> None:
    key = (doc.get("apiVersion", ""), doc.get("kind", ""))
    validator = crd_validators().get(key)
    assert validator is not None, f"no served CRD version for {key}; known: {sorted(crd_validators())}"
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{key[1]} {'.'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)
    name = doc["metadata"]["name"]
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63, name


def validate_core(doc: dict) -> None:
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            raise AssertionError(f"{doc['kind']} {doc['metadata'].get('name')} on Kubernetes {version}: "
                                 f"{'.'.join(map(str, e.path))}: {e.message}") from None


def validate(doc: dict) -> None:
    if doc["kind"] in CORE_KINDS:
        validate_core(doc)
    else:
        validate_custom(doc)


def test_crd_files_are_the_published_ones() -> None:
    for path, blob in CRDS.items():
        assert git_blob_id(path.read_bytes()) == blob, f"{path} differs from the published file"
        readme = (path.parent / "README.md").read_text()
        assert path.name in readme and blob in readme, f"{path.parent}/README.md does not name {path.name} {blob}"
    kserve = (KSERVE / "schemas" / "README.md").read_text()
    assert "v0.20.0" in kserve and "1fb781055dd1567164358233e1125142ca6ef1fe" in kserve


def test_strict_schemas_reject_unknown_fields() -> None:
    runtime = one(KSERVE / "servingruntime.yaml")
    validate_custom(runtime)
    typo = json.loads(json.dumps(runtime))
    typo["spec"]["protocolVersion"] = ["v2"]
    with pytest.raises(AssertionError, match="protocolVersion"):
        validate_custom(typo)
    wrong = json.loads(json.dumps(runtime))
    wrong["spec"]["supportedModelFormats"][0]["priority"] = "high"
    with pytest.raises(AssertionError, match="priority"):
        validate_custom(wrong)
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
               "spec": {"ports": [{"port": 8000, "targetPrt": 8000}]}}
    with pytest.raises(AssertionError, match="targetPrt"):
        validate_core(service)


# ---- what the container arguments mean to aserve ----


def served_settings(container: dict, **replace: str) -> ServerSettings:
    """The settings `aserve serve` starts with from a container's command and args
    (KServe's `{{.Name}}` and the like replaced first), as the image runs them."""
    command = container["command"] + container.get("args", [])
    assert command[:2] == ["aserve", "serve"], command
    argv = []
    for arg in command[1:]:
        for old, new in replace.items():
            arg = arg.replace(old, new)
        assert "{{" not in arg, f"a placeholder is left in {arg!r}"
        argv.append(arg)
    return settings_from_args(build_parser().parse_args(argv))


def cpus(quantity: str | int) -> float:
    text = str(quantity)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


def check_container(container: dict, settings: ServerSettings, dockerfile: Dockerfile) -> None:
    """Interpreters = requested CPUs, the image's port and user, the probes, the preStop hook."""
    requests, limits = container["resources"]["requests"], container["resources"].get("limits", {})
    assert settings.interpreters is not None and 1 <= settings.interpreters <= MAX_INTERPRETERS
    assert cpus(requests["cpu"]) == settings.interpreters, (requests, settings.interpreters)
    if "cpu" in limits:
        assert cpus(limits["cpu"]) == settings.interpreters
    assert settings.host == "0.0.0.0"
    exposed = {int(p.split("/")[0]) for args in dockerfile.final.all("EXPOSE") for p in args.split()}
    ports = {p.get("name"): p["containerPort"] for p in container["ports"]}
    # HTTP, and gRPC where the container declares it (Knative routes one port: KServe's runtime
    # declares HTTP's, and an InferenceService may name gRPC's instead)
    assert settings.port in ports.values() and set(ports.values()) <= {settings.port, settings.grpc_port}
    assert settings.port in exposed  # EXPOSE names the image's defaults: HTTP's 8000 and gRPC's 8001
    for probe, path in (("readinessProbe", READY), ("livenessProbe", LIVE)):
        check_probe(container[probe], path, settings, ports)
    # a leaving pod fails its readiness probe within its drain (where only the probe takes it out)
    readiness = container["readinessProbe"]
    assert settings.drain_s >= readiness.get("periodSeconds", 10) * readiness.get("failureThreshold", 3)
    user = " ".join(dockerfile.final.all("RUN"))
    uid = re.search(r"useradd [^&]*--uid (\d+)", user)
    assert uid and "aserve" in dockerfile.final.all("USER")
    run_as = container.get("securityContext", {}).get("runAsUser")
    assert run_as in (None, int(uid[1]))
    check_pre_stop(container, settings)


def check_probe(probe: dict, path: str, settings: ServerSettings, ports: dict[str | None, int]) -> None:
    """An HTTP probe GETs the health route on the HTTP port; a gRPC one asks the gRPC front's
    health service for readiness ("") or liveness ("liveness")."""
    if "grpc" in probe:
        assert settings.grpc and probe["grpc"]["port"] == settings.grpc_port, probe
        assert probe["grpc"].get("service", "") == ("" if path == READY else "liveness"), probe
        return
    get = probe["httpGet"]
    assert get["path"] == path and get["port"] in (settings.port, *ports), get
    if get["port"] in ports:
        assert ports[get["port"]] == settings.port, (get, ports)


def pre_stop_code(container: dict) -> str:
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["python", "-c"] and len(command) == 3, command
    return command[2]


def check_pre_stop(container: dict, settings: ServerSettings) -> None:
    """The hook signals the server (process 1) to drain and waits for readiness to say so;
    test_k8s_serve.py runs this very code against a real server."""
    code = pre_stop_code(container)
    compile(code, "preStop", "exec")
    assert "os.kill(1, signal.SIGUSR1)" in code
    assert f"http://127.0.0.1:{settings.port}{READY}" in code
    assert settings.drain_s > 0


# ---- KServe ----


@pytest.fixture(scope="module")
def runtimes() -> dict[str, dict]:
    return {kind: one(KSERVE / f"{kind.lower()}.yaml") for kind in ("ServingRuntime", "ClusterServingRuntime")}


@pytest.fixture(scope="module")
def isvc() -> dict:
    return one(KSERVE / "inferenceservice-mlp.yaml")


def test_grpc_inference_service_reaches_the_grpc_port(runtimes: dict[str, dict], dockerfile: Dockerfile) -> None:
    """inferenceservice-grpc.yaml names the runtime's --grpc-port as its one (h2c) port, and
    switches both probes to gRPC's health service."""
    grpc_isvc = one(KSERVE / "inferenceservice-grpc.yaml")
    validate_custom(grpc_isvc)
    model = grpc_isvc["spec"]["predictor"]["model"]
    [container] = runtimes["ServingRuntime"]["spec"]["containers"]
    settings = served_settings(container, **{"{{.Name}}": grpc_isvc["metadata"]["name"]})
    assert settings.grpc and settings.grpc_port == 8001
    assert model["runtime"] == runtimes["ServingRuntime"]["metadata"]["name"]
    assert [(p["name"], p["containerPort"]) for p in model["ports"]] == [("h2c", settings.grpc_port)]
    assert str(settings.grpc_port) in " ".join(dockerfile.final.all("EXPOSE")).split()
    check_probe(model["readinessProbe"], READY, settings, {})
    check_probe(model["livenessProbe"], LIVE, settings, {})
    assert "grpc" in model["readinessProbe"] and "grpc" in model["livenessProbe"]


def test_kserve_files_are_valid(runtimes: dict[str, dict], isvc: dict) -> None:
    for kind, runtime in runtimes.items():
        assert runtime["kind"] == kind
        validate_custom(runtime)
    validate_custom(isvc)
    assert runtimes["ServingRuntime"]["spec"] == runtimes["ClusterServingRuntime"]["spec"]
    assert runtimes["ServingRuntime"]["metadata"] == runtimes["ClusterServingRuntime"]["metadata"]


def test_serving_runtime_fields(runtimes: dict[str, dict], dockerfile: Dockerfile) -> None:
    spec = runtimes["ServingRuntime"]["spec"]
    assert spec["protocolVersions"] == ["v2"]
    assert spec.get("multiModel", False) is False
    formats = {f["name"]: f for f in spec["supportedModelFormats"]}
    assert set(formats) == {"aserve-python", "pytorch-package"}
    assert all(f["autoSelect"] and f["priority"] >= 1 and f["version"] for f in formats.values())
    [container] = spec["containers"]
    assert container["name"] == "kserve-container"  # the container KServe merges the predictor into
    settings = served_settings(container, **{"{{.Name}}": "mlp"})
    assert settings.repository == "/mnt/models" and settings.model_name == "mlp"
    check_container(container, settings, dockerfile)
    assert spec["annotations"]["prometheus.kserve.io/port"] == str(settings.port)
    assert spec["annotations"]["prometheus.kserve.io/path"] == "/metrics"


def test_inference_service_uses_the_runtime(runtimes: dict[str, dict], isvc: dict) -> None:
    runtime = runtimes["ServingRuntime"]
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    assert "YOUR-BUCKET" in model["storageUri"]  # a placeholder, marked as one in the file
    # KServe appends the predictor's args to the runtime's; what the pod then runs:
    [container] = runtime["spec"]["containers"]
    settings = served_settings(container, **{"{{.Name}}": isvc["metadata"]["name"]})
    grace = isvc["spec"]["predictor"]["terminationGracePeriodSeconds"]
    assert settings.drain_s + settings.shutdown_timeout_s < grace
    # the commented alternative in the file: four interpreters, four CPUs
    bigger = dict(container, args=container["args"] + ["--interpreters=4"])
    assert served_settings(bigger, **{"{{.Name}}": "mlp"}).interpreters == 4
    text = (KSERVE / "inferenceservice-mlp.yaml").read_text()
    assert '# args: ["--interpreters=4"]' in text and 'requests: {cpu: "4"' in text


# ---- the Helm chart, rendered by Helm ----

RENDER = textwrap.dedent('''
    import json, sys
    import helm_python as helm
    helm.disable_logging()
    cases = json.load(sys.stdin)
    out = {"lint": helm.lint(sys.argv[1], strict=True), "cases": []}
    with helm.Chart.load(sys.argv[1]) as chart:
        for values in cases:
            try:
                out["cases"].append({"manifests": chart.render(values, name="demo", namespace="serving",
                                                                is_install=True)})
            except helm.HelmError as e:
                out["cases"].append({"error": str(e)})
    json.dump(out, sys.stdout)
''')

DEFAULTS: dict = {}
EVERYTHING = {
    "interpreters": 4,
    "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "repository": {"pollSeconds": 30, "init": {
        "enabled": True, "image": "google/cloud-sdk:slim",
        "command": ["gsutil", "-m", "rsync", "-r", "gs://YOUR-BUCKET/models", "/models"]}},
    "tracing": {"otlpEndpoint": "http://otel-collector.observability:4318", "sampler": "parentbased_traceidratio",
                "samplerArg": "0.1"},
    "extraArgs": ["--access-log", "--log-format=json"],
    "extraEnv": [{"name": "ASERVE_ENGINE", "value": "private"}],
    "resources": {"requests": {"cpu": "4000m", "memory": "3Gi"}, "limits": {"memory": "6Gi"}, "cpuLimit": False},
    "terminationGracePeriodSeconds": 60,
    "probes": {"type": "grpc"},
    "grpc": {"port": 9001},
}
VOLUME = {
    "grpc": {"enabled": False},
    "repository": {"volume": {"persistentVolumeClaim": {"claimName": "aserve-models", "readOnly": True}}},
    "autoscaling": {"enabled": False}, "podDisruptionBudget": {"enabled": False}, "replicaCount": 3,
}
REFUSED = [
    ({"interpreters": 16}, "interpreters: expected a whole number from 1 to 15"),
    ({"interpreters": 0}, "interpreters: expected a whole number from 1 to 15"),
    ({"interpreters": 2.5}, "interpreters: expected a whole number from 1 to 15"),
    ({"resources": {"requests": {"cpu": "4", "memory": "2Gi"}}}, "resources.requests.cpu is 4 but interpreters is 2"),
    ({"resources": {"limits": {"cpu": "1"}}}, "resources.limits.cpu is 1 but interpreters is 2"),
    ({"terminationGracePeriodSeconds": 30}, "must be above drainSeconds + shutdownTimeoutSeconds (38)"),
    ({"repository": {"init": {"enabled": True}}}, "repository.init.image is required"),
    ({"probes": {"type": "grpc"}, "grpc": {"enabled": False}}, "probes.type grpc needs grpc.enabled"),
    ({"probes": {"type": "tcp"}}, 'probes.type: expected http or grpc, got "tcp"'),
]
CASES = [DEFAULTS, EVERYTHING, VOLUME] + [values for values, _ in REFUSED]

needs_helm = pytest.mark.skipif(importlib.util.find_spec("helm_python") is None,
                                reason="helm-python-sdk (Helm's engine) is installed for the Python 3.11 run on x86-64 Linux")


@pytest.fixture(scope="module")
def rendered() -> dict:
    """Helm's lint report and each case's manifests (or its error), from one subprocess: the
    Go runtime of Helm's library stays out of the test process."""
    done = subprocess.run([sys.executable, "-c", RENDER, str(CHART)], input=json.dumps(CASES), capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def objects(case: dict) -> dict[str, dict]:
    """kind -> the one object of that kind a rendered case holds."""
    assert "error" not in case, case.get("error")
    out: dict[str, dict] = {}
    for name, text in case["manifests"].items():
        if not name.endswith(".yaml"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                assert doc["kind"] not in out, f"two {doc['kind']} objects"
                out[doc["kind"]] = doc
    return out


@needs_helm
def test_chart_lints(rendered: dict) -> None:
    report = rendered["lint"]
    assert report["total_charts_linted"] == 1 and not report["errors"], report
    assert all(m["severity"] <= 1 for m in report["messages"]), report["messages"]  # info only (no icon)


@needs_helm
@pytest.mark.parametrize("index", range(3), ids=["defaults", "everything", "volume"])
def test_chart_renders_valid_objects(rendered: dict, index: int) -> None:
    found = objects(rendered["cases"][index])
    expected = {"Deployment", "Service"} | {
        0: {"HorizontalPodAutoscaler", "PodDisruptionBudget"},
        1: {"HorizontalPodAutoscaler", "PodDisruptionBudget", "ServiceMonitor"}, 2: set()}[index]
    assert set(found) == expected
    for doc in found.values():
        validate(doc)


@needs_helm
def test_chart_refuses_inconsistent_values(rendered: dict) -> None:
    for (values, message), case in zip(REFUSED, rendered["cases"][3:], strict=True):
        assert "error" in case, f"{values} rendered"
        assert message in case["error"], (values, case["error"])


def deployment_parts(found: dict[str, dict]) -> tuple[dict, dict, ServerSettings]:
    deployment = found["Deployment"]
    pod = deployment["spec"]["template"]
    [container] = pod["spec"]["containers"]
    return pod, container, served_settings(container)


@needs_helm
@pytest.mark.parametrize("index", range(3), ids=["defaults", "everything", "volume"])
def test_chart_agrees_with_the_server(rendered: dict, index: int, dockerfile: Dockerfile) -> None:
    values = CASES[index]
    found = objects(rendered["cases"][index])
    pod, container, settings = deployment_parts(found)
    check_container(container, settings, dockerfile)
    assert settings.interpreters == values.get("interpreters", 2)
    assert settings.repository == "/models"
    assert settings.drain_s > 0
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert grace > settings.drain_s + settings.shutdown_timeout_s
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    # the probes: startup on readiness (liveness waits for the first load), then both
    check_probe(container["startupProbe"], READY, settings, {p["name"]: p["containerPort"] for p in container["ports"]})
    assert ("grpc" in container["startupProbe"]) == (index == 1)  # EVERYTHING: probes.type grpc
    assert settings.grpc == (index != 2)  # VOLUME: grpc.enabled false, --no-grpc
    if settings.grpc:
        assert settings.grpc_port == (9001 if index == 1 else 8001)
    # the preStop hook is the KServe runtime's, which test_k8s_serve.py runs against a real server
    [runtime] = one(KSERVE / "servingruntime.yaml")["spec"]["containers"]
    assert pre_stop_code(container) == pre_stop_code(runtime)
    # the rolling update never goes below the wanted count
    assert found["Deployment"]["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    # the Service selects the pods and reaches the container's port by name
    labels = pod["metadata"]["labels"]
    service = found["Service"]["spec"]
    assert service["selector"].items() <= labels.items()
    assert found["Deployment"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    names = ["http", "grpc"] if settings.grpc else ["http"]
    assert [p["targetPort"] for p in service["ports"]] == [p["name"] for p in container["ports"]] == names
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    mounts = {m["name"]: m for m in container.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    if index == 0:
        assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in env and not mounts and not volumes  # the bundled examples
        assert found["Deployment"]["spec"].get("replicas") is None  # the HPA owns the count
    if index == 1:
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == EVERYTHING["tracing"]["otlpEndpoint"]
        assert env["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio" and env["OTEL_TRACES_SAMPLER_ARG"] == "0.1"
        assert env["ASERVE_ENGINE"] == "private" and settings.access_log and settings.log_format == "json"
        assert settings.repository_poll_s == 30
        assert container["resources"]["requests"]["cpu"] == "4" and "cpu" not in container["resources"]["limits"]
        assert grace == 60
        [init] = pod["spec"]["initContainers"]
        assert init["volumeMounts"] == [{"name": "repository", "mountPath": "/models"}]
        assert volumes["repository"] == {"name": "repository", "emptyDir": {}}
        assert mounts["repository"]["readOnly"] is True
        monitor = found["ServiceMonitor"]["spec"]
        assert monitor["selector"]["matchLabels"].items() <= found["Service"]["metadata"]["labels"].items()
        assert [(e["port"], e["path"]) for e in monitor["endpoints"]] == [("http", "/metrics")]
        assert found["ServiceMonitor"]["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    if index == 2:
        assert volumes["repository"]["persistentVolumeClaim"]["claimName"] == "aserve-models"
        assert mounts["repository"] == {"name": "repository", "mountPath": "/models", "readOnly": True}
        assert found["Deployment"]["spec"]["replicas"] == 3
    if "HorizontalPodAutoscaler" in found:
        hpa = found["HorizontalPodAutoscaler"]["spec"]
        assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                         "name": found["Deployment"]["metadata"]["name"]}
        kinds = {m["type"]: m for m in hpa["metrics"]}
        assert kinds["Resource"]["resource"]["name"] == "cpu"
        assert kinds["Pods"]["pods"]["metric"]["name"] == "aserve_queue_samples_per_interpreter"
        pdb = found["PodDisruptionBudget"]["spec"]
        assert pdb["selector"]["matchLabels"].items() <= labels.items()


def test_chart_values_are_documented() -> None:
    """Every value in values.yaml has a comment (on it or on its block), and the README names
    each top-level value."""
    text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)
    readme = (CHART / "README.md").read_text()
    for key in values:
        assert f"`{key}" in readme, f"README.md does not describe {key}"
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(\w+):", line)
        if m:
            above = lines[i - 1] if i else ""
            assert above.lstrip().startswith("#") or "#" in line, f"values.yaml: {m[1]} has no comment"


# ---- the HPA's queue metric ----


def adapter_rule() -> dict:
    [rule] = yaml.safe_load(ADAPTER.read_text())["rules"]["custom"]
    return rule


def test_adapter_serves_the_hpa_metric() -> None:
    rule = adapter_rule()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert rule["name"]["as"] == values["autoscaling"]["queue"]["metricName"]
    assert re.fullmatch(rule["name"]["matches"], "aserve_queue_samples")
    assert rule["resources"]["overrides"].keys() == {"namespace", "pod"}


async def test_hpa_metric_series_are_exported(start_server, http: aiohttp.ClientSession,
                                              tmp_path: pathlib.Path) -> None:
    rule = adapter_rule()
    query = re.sub(r"<<\.\w+>>", "", rule["metricsQuery"])
    names = metric_names(query) | metric_names(rule["seriesQuery"])
    assert names == {"aserve_queue_samples", "aserve_pool_interpreters"}
    m = await exported(start_server, http, tmp_path / "repo")
    for name in names:
        assert m.family(name).type == "gauge" and m.samples(name), name
    assert all(set(s.labels) == {"model", "version"} for s in m.samples("aserve_queue_samples"))
    assert sum(s.value for s in m.samples("aserve_pool_interpreters")) >= 1
