#!/usr/bin/env bash
# The compose stack of docker/compose.yaml with docker or podman, with a registry or without.
# `./dev compose ARGS` runs it; ARGS are compose's own:
#
#   docker/compose.sh up -d                                  # aserve, Prometheus (Jaeger, Grafana)
#   docker/compose.sh --profile load run --rm locust         # 60 s of Locust load, headless
#   docker/compose.sh down
#
# docker: `docker compose -f docker/compose.yaml ARGS`. podman: the same with podman-compose
# (from PATH, or installed from PyPI into .venv-compose). Where the registry's images cannot
# be pulled, docker/local/compose.yaml is laid over the file: Prometheus (Debian's build)
# and Locust (the compose file's version, from PyPI) from images made here, first, from
# docker/local/*.Dockerfile; Jaeger and Grafana behind the profile `registry`; and the aserve
# image from ./dev image when it is missing. podman without systemd runs no health checks:
# after `up`, and before `run`, this runs aserve's until it is healthy (Locust waits for it).
set -euo pipefail
cd "$(dirname "$0")/.."

FILES=(-f docker/compose.yaml)
ASERVE_CONTAINER=aserve_aserve_1  # podman-compose's name: project aserve, service aserve, first

say() { echo "aserve compose: $*" >&2; }
die() { say "$*"; exit 1; }

image_of() { # the image a compose service names
    awk -v svc="  $1:" '$0 == svc { on = 1; next } on && /^  [a-z]/ { on = 0 } on && $1 == "image:" { print $2; exit }' \
        docker/compose.yaml
}

if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    exec docker compose "${FILES[@]}" "$@"
fi
command -v podman >/dev/null 2>&1 || die "no container engine: ./dev image installs podman (as root), or install docker"

COMPOSE=(podman-compose)
if ! command -v podman-compose >/dev/null 2>&1; then
    if [ ! -x .venv-compose/bin/podman-compose ]; then
        say "installing podman-compose (PyPI) into .venv-compose"
        python3 -m venv .venv-compose
        .venv-compose/bin/pip install -q --disable-pip-version-check podman-compose
    fi
    COMPOSE=(.venv-compose/bin/podman-compose)
fi

prometheus=$(image_of prometheus)
if [ -n "${ASERVE_COMPOSE_LOCAL:-}" ] || ! { podman image exists "$prometheus" ||
        timeout 120 podman pull -q "docker.io/$prometheus" >/dev/null 2>&1; }; then
    say "$prometheus cannot be pulled: Prometheus and Locust from images made here (docker/local/)"
    FILES+=(-f docker/local/compose.yaml)
    podman image exists aserve:latest || docker/image.sh >/dev/null
    podman image exists localhost/aserve-bookworm-rootfs:minbase ||
        die "no local root file system (localhost/aserve-bookworm-rootfs:minbase): ./dev image makes it"
    if ! podman image exists localhost/aserve-prometheus:debian; then
        say "building localhost/aserve-prometheus:debian (Debian's prometheus package)"
        podman build --format docker -q -t localhost/aserve-prometheus:debian \
            -f docker/local/prometheus.Dockerfile docker/base >/dev/null
    fi
    if ! podman image exists localhost/aserve-locust:local; then
        locust=$(image_of locust)
        base=docker.io/library/python:3.11-slim-bookworm
        podman image exists "$base" || base=localhost/aserve-python:3.11-slim-bookworm
        say "building localhost/aserve-locust:local (locust ${locust##*:} from PyPI on $base)"
        podman build --format docker -q -t localhost/aserve-locust:local --build-arg "PYTHON_IMAGE=$base" \
            --build-arg "LOCUST_VERSION=${locust##*:}" -f docker/local/locust.Dockerfile docker/local >/dev/null
    fi
fi

wait_healthy() { # the image's HEALTHCHECK, run until aserve is healthy (podman without systemd)
    [ -d /run/systemd/system ] && return 0
    podman container exists "$ASERVE_CONTAINER" || return 0
    local i
    for i in $(seq 600); do
        [ "$(podman inspect --format '{{.State.Health.Status}}' "$ASERVE_CONTAINER" 2>/dev/null)" = healthy ] && return 0
        podman healthcheck run "$ASERVE_CONTAINER" >/dev/null 2>&1 || sleep 0.3
    done
    die "aserve is not healthy: podman logs $ASERVE_CONTAINER"
}

case " $* " in
*" run "*) wait_healthy ;;
esac
"${COMPOSE[@]}" "${FILES[@]}" "$@"
case " $* " in
*" up "*) wait_healthy ;;
esac
