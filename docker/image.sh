#!/usr/bin/env bash
# Builds aserve's image from docker/Dockerfile, unchanged, with docker (when its daemon
# answers) or podman. `./dev image` runs it; so can a user, from anywhere.
#
#   docker/image.sh                      # -> aserve:latest
#   ASERVE_IMAGE=aserve:dev docker/image.sh
#
# What it needs it makes, so that the build also works on a machine that reaches no image
# registry and no PyTorch index (only Debian's archive and PyPI):
#   - a container engine: as root, with apt-get, podman (with runc and debootstrap) is
#     installed when neither engine works; on cgroups v1, and where the hard open-files
#     limit is lower than rootful podman's default container limits, a drop-in
#     /etc/containers/containers.conf.d/aserve.conf makes podman use runc (crun refuses
#     cgroups v1) and the host's limits;
#   - the base: python:3.11-slim-bookworm when it is present or can be pulled; otherwise a
#     local stand-in, localhost/aserve-python:3.11-slim-bookworm (docker/base/Dockerfile:
#     CPython 3.11 with a shared libpython, built on a debootstrap'd bookworm);
#   - torch's CPU wheel: PyTorch's index when it answers; otherwise a PEP 503 index served
#     on 127.0.0.1 for the build, of a local torch-<version>+cpu wheel (in $ASERVE_WHEELS,
#     default /opt/wheels, or pip's find-links) and its dependencies from PyPI.
#
# Environment: ASERVE_IMAGE (the tag, default aserve:latest), ASERVE_ENGINE (docker or podman),
# ASERVE_DOCKERFILE (another Dockerfile to build the same way, default docker/Dockerfile),
# PYTHON_IMAGE (a base to use as it is), TORCH_INDEX_URL (an index to use as it is),
# ASERVE_WHEELS, DEBIAN_MIRROR (for debootstrap, default http://deb.debian.org/debian).
# Prints, last, one line of JSON: the engine, the tag, the base, the seconds each step took
# and the image's size in bytes.
set -euo pipefail
cd "$(dirname "$0")/.."

TAG=${ASERVE_IMAGE:-aserve:latest}
DOCKERFILE=${ASERVE_DOCKERFILE:-docker/Dockerfile}
OFFICIAL_BASE=docker.io/library/python:3.11-slim-bookworm
STANDIN_BASE=localhost/aserve-python:3.11-slim-bookworm
ROOTFS=localhost/aserve-bookworm-rootfs:minbase
CONF_DROPIN=/etc/containers/containers.conf.d/aserve.conf

say() { echo "aserve image: $*" >&2; }
die() { say "$*"; exit 1; }
is_root() { [ "$(id -u)" = 0 ]; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

apt_install() { # apt_install PACKAGE...: as root, with apt-get; false otherwise
    is_root && command -v apt-get >/dev/null 2>&1 || return 1
    say "installing $* (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null 2>&1; }
}

pick_engine() {
    if [ -n "${ASERVE_ENGINE:-}" ]; then
        command -v "$ASERVE_ENGINE" >/dev/null 2>&1 || die "ASERVE_ENGINE=$ASERVE_ENGINE is not installed"
        ENGINE=$ASERVE_ENGINE
    elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
        ENGINE=docker
    elif command -v podman >/dev/null 2>&1; then
        ENGINE=podman
    elif apt_install podman runc; then
        ENGINE=podman
    else
        die "no container engine: install docker or podman (as root, this script installs podman with apt-get)"
    fi
}

setup_podman() { # rootful podman on this host: runc on cgroups v1, the host's rlimits
    is_root || return 0
    local settings=()
    if [ "$(stat -fc %T /sys/fs/cgroup)" != cgroup2fs ]; then
        if [ "$(podman info --format '{{.Host.OCIRuntime.Name}}' 2>/dev/null)" != runc ]; then
            command -v runc >/dev/null 2>&1 || apt_install runc || die "cgroups v1 needs runc: install it"
            settings+=("[engine]" 'runtime = "runc"  # crun refuses cgroups v1')
        fi
    fi
    # rootful podman gives containers nofile and nproc limits of 1048576 and up, which a
    # process cannot raise past its own hard limit: no container would start
    local nofile
    nofile=$(ulimit -Hn)
    if [ "$nofile" != unlimited ] && [ "$nofile" -lt 1048576 ]; then
        settings+=("[containers]" "default_ulimits = []  # the host's limits: this host's hard limit is lower than podman's default")
    fi
    [ ${#settings[@]} -gt 0 ] || return 0
    local text
    text=$(printf '# written by aserve docker/image.sh\n'; printf '%s\n' "${settings[@]}")
    if [ "$(cat "$CONF_DROPIN" 2>/dev/null)" != "$text" ]; then
        say "writing $CONF_DROPIN: ${settings[*]}"
        mkdir -p "$(dirname "$CONF_DROPIN")"
        printf '%s\n' "$text" >"$CONF_DROPIN"
    fi
}

has_image() { "$ENGINE" image inspect "$1" >/dev/null 2>&1; }

host_ca_bundle() {
    local f
    for f in "${PIP_CERT:-}" "${SSL_CERT_FILE:-}" /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt; do
        [ -n "$f" ] && [ -f "$f" ] && { echo "$f"; return 0; }
    done
    return 1
}

make_standin_base() { # debootstrap'd bookworm -> imported ROOTFS -> docker/base/Dockerfile -> STANDIN_BASE
    local tmp started
    BASE_TMP=$(mktemp -d /tmp/aserve-base.XXXXXX)
    tmp=$BASE_TMP
    if ! has_image "$ROOTFS"; then
        is_root || die "no registry answers and making a stand-in base needs root (debootstrap): run as root or pass PYTHON_IMAGE"
        command -v debootstrap >/dev/null 2>&1 || apt_install debootstrap || die "debootstrap is not installed"
        say "debootstrap bookworm (minbase) -> $ROOTFS"
        started=$(now)
        debootstrap --variant=minbase bookworm "$tmp/rootfs" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" \
            >"$tmp/debootstrap.log" 2>&1 || { tail -20 "$tmp/debootstrap.log" >&2; die "debootstrap failed"; }
        # debootstrap leaves the packages it installed, and apt's lists, behind
        rm -rf "$tmp"/rootfs/var/cache/apt/archives/*.deb "$tmp"/rootfs/var/lib/apt/lists/*
        tar -C "$tmp/rootfs" -c . | "$ENGINE" import - "$ROOTFS" >/dev/null
        rm -rf "$tmp/rootfs"
        TIMES+=("\"rootfs_s\": $(since "$started")")
    fi
    mkdir "$tmp/context"
    cp docker/base/Dockerfile docker/base/sources.list "$tmp/context/"
    cp "$(host_ca_bundle || die "no CA bundle found for pip (set PIP_CERT)")" "$tmp/context/build-ca.crt"
    say "building the stand-in base $STANDIN_BASE (CPython from source: several minutes)"
    started=$(now)
    local args=(build --build-arg "ROOTFS=$ROOTFS" -t "$STANDIN_BASE")
    [ "$ENGINE" = podman ] && args+=(--format docker --layers=false)
    "$ENGINE" "${args[@]}" "$tmp/context" >&2
    TIMES+=("\"base_s\": $(since "$started")")
    rm -rf "$tmp"
}

pick_base() {
    if [ -n "${PYTHON_IMAGE:-}" ]; then
        BASE=$PYTHON_IMAGE
    elif has_image "$OFFICIAL_BASE"; then
        BASE=$OFFICIAL_BASE
    elif has_image "$STANDIN_BASE"; then
        BASE=$STANDIN_BASE
    elif timeout 120 "$ENGINE" pull -q "$OFFICIAL_BASE" >/dev/null 2>&1; then
        BASE=$OFFICIAL_BASE
    else
        say "$OFFICIAL_BASE cannot be pulled: making a local stand-in"
        make_standin_base
        BASE=$STANDIN_BASE
    fi
}

dockerfile_arg() { # the default of an ARG in the Dockerfile
    sed -n "s/^ARG $1=//p" "$DOCKERFILE" | head -1
}

serve_torch_index() { # a PEP 503 index on 127.0.0.1 of the local CPU torch wheel and its dependencies
    local version wheel dir py port
    version=$(dockerfile_arg TORCH_VERSION)
    for dir in ${ASERVE_WHEELS:-} ${PIP_FIND_LINKS:-} /opt/wheels; do
        wheel=$(ls "$dir"/torch-"$version"+cpu-cp311-cp311-*"$(uname -m)".whl 2>/dev/null | head -1) && [ -n "$wheel" ] && break
    done
    [ -n "${wheel:-}" ] || die "PyTorch's index does not answer and no torch-$version+cpu wheel for CPython 3.11 was found (ASERVE_WHEELS, PIP_FIND_LINKS, /opt/wheels): set TORCH_INDEX_URL or ASERVE_WHEELS"
    py=python3
    [ -x .venv/bin/python ] && py=.venv/bin/python
    INDEX_DIR=$(mktemp -d /tmp/aserve-torch-index.XXXXXX)
    say "serving a local index of $(basename "$wheel") and its dependencies"
    "$py" -m pip download -q --disable-pip-version-check --dest "$INDEX_DIR/files" --only-binary=:all: \
        --python-version 3.11 --implementation cp --abi cp311 \
        --platform "manylinux_2_28_$(uname -m)" --platform "manylinux2014_$(uname -m)" \
        --find-links "$(dirname "$wheel")" "torch==$version+cpu" >&2
    "$py" docker/pep503.py "$INDEX_DIR/files" "$INDEX_DIR/simple"
    # the same port from build to build where it is free: the URL is a build argument, and a
    # new one would make the engine install torch again instead of using its cached layer
    port=$("$py" -c '
import socket
s = socket.socket()
try:
    s.bind(("127.0.0.1", 39503))
except OSError:
    s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
    "$py" -m http.server --bind 127.0.0.1 --directory "$INDEX_DIR" "$port" >/dev/null 2>&1 &
    INDEX_PID=$!
    local i
    for i in $(seq 100); do
        "$py" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/simple/torch/', timeout=1)" \
            2>/dev/null && break
        sleep 0.1
    done
    TORCH_INDEX=http://127.0.0.1:$port/simple/
}

dangling() { "$ENGINE" images -q --no-trunc --filter dangling=true 2>/dev/null | sort -u; }

cleanup() {
    # without a layer cache, the images a build leaves unnamed (the builder stage's, a failed
    # step's) are of no further use: remove those this build made
    if [ -n "${DANGLING_BEFORE+set}" ]; then
        comm -13 <(printf '%s\n' "$DANGLING_BEFORE") <(dangling) | xargs -r "$ENGINE" rmi >/dev/null 2>&1 || true
    fi
    [ -n "${BASE_TMP:-}" ] && rm -rf "$BASE_TMP"
    [ -n "${INDEX_PID:-}" ] && kill "$INDEX_PID" 2>/dev/null
    [ -n "${INDEX_DIR:-}" ] && rm -rf "$INDEX_DIR"
    return 0
}
trap cleanup EXIT

TIMES=()
started_all=$(now)
pick_engine
[ "$ENGINE" = podman ] && setup_podman
pick_base
say "engine $ENGINE, base $BASE"

args=(build -f "$DOCKERFILE" -t "$TAG" --build-arg "PYTHON_IMAGE=$BASE")
if [ "$ENGINE" = podman ]; then
    # podman's default OCI format has no HEALTHCHECK: the Docker format keeps it
    args+=(--format docker)
    # buildah 1.28 (podman 4.3, Debian bookworm's) mounts an empty folder for
    # `RUN --mount=...,from=builder` when the builder stage came from its layer cache
    # (containers/buildah#4375, fixed after it), and the install finds no wheel: no cache there
    buildah=$(podman info --format '{{.Host.BuildahVersion}}' 2>/dev/null || echo 0)
    if printf '1.29\n%s\n' "$buildah" | sort -V -C 2>/dev/null; then :; else
        say "buildah $buildah: building without its layer cache (containers/buildah#4375)"
        args+=(--no-cache)
        DANGLING_BEFORE=$(dangling)
    fi
fi
if [ -n "${TORCH_INDEX_URL:-}" ]; then
    args+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
elif ! curl -fsS --max-time 20 -o /dev/null "$(dockerfile_arg TORCH_INDEX_URL)/torch/" 2>/dev/null; then
    serve_torch_index
    args+=(--network host --build-arg "TORCH_INDEX_URL=$TORCH_INDEX")
fi
old=$("$ENGINE" image inspect --format '{{.Id}}' "$TAG" 2>/dev/null || true)
say "$ENGINE ${args[*]} ."
started=$(now)
"$ENGINE" "${args[@]}" . >&2
TIMES+=("\"image_s\": $(since "$started")")
new=$("$ENGINE" image inspect --format '{{.Id}}' "$TAG")
# the image this one replaces, unless a container still uses it
[ -n "$old" ] && [ "$old" != "$new" ] && "$ENGINE" rmi "$old" >/dev/null 2>&1 || true
size=$("$ENGINE" image inspect --format '{{.Size}}' "$TAG")
TIMES+=("\"total_s\": $(since "$started_all")")
say "built $TAG: $(awk -v b="$size" 'BEGIN { printf "%.2f GB", b / 1e9 }')"
printf '{"engine": "%s", "image": "%s", "base": "%s", %s, "size_bytes": %s}\n' \
    "$ENGINE" "$TAG" "$BASE" "$(IFS=,; echo "${TIMES[*]}" | sed 's/,/, /g')" "$size"
