"""docker/Dockerfile and .dockerignore, read: the stages, the user, the port, the health check,
and that the image installs the project the way the README's `./dev` does."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import tomllib

import pytest

from aserve.config import FIELDS
from aserve.engine.tunables import REQUIRED

from .conftest import ROOT, Dockerfile, Stage

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def env(stage: Stage) -> dict[str, str]:
    out: dict[str, str] = {}
    for args in stage.all("ENV"):
        for item in shlex.split(args):
            key, eq, value = item.partition("=")
            assert eq, f"ENV {args!r}: use KEY=VALUE"
            out[key] = value
    return out


def exec_form(args: str) -> list[str]:
    form = json.loads(args)
    assert isinstance(form, list) and all(isinstance(a, str) for a in form), args
    return form


def pip_installs(stage: Stage, dockerfile: Dockerfile) -> list[list[str]]:
    """The arguments of every `pip install` the stage runs, its ARGs expanded."""
    out = []
    for run in stage.all("RUN"):
        command = re.sub(r"^(--\S+\s+)*", "", dockerfile.expand(run))  # RUN's own options (--mount=...)
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        commands: list[list[str]] = [[]]
        for token in lexer:
            if token in ("&&", ";", "||"):
                commands.append([])
            else:
                commands[-1].append(token)
        for words in commands:
            if words[:2] == ["pip", "install"] or words[:4] == ["python", "-m", "pip", "install"]:
                out.append(words[words.index("install") + 1:])
    return out


def test_multi_stage_build_makes_the_wheel_and_the_runtime_installs_it(dockerfile: Dockerfile) -> None:
    assert len(dockerfile.stages) >= 2
    builder = next(s for s in dockerfile.stages if s.name == "builder")
    assert builder is not dockerfile.final
    # the builder compiles: a C compiler, and `pip wheel .` over the project's build files
    assert any("gcc" in run for run in builder.all("RUN"))
    copied = " ".join(builder.all("COPY"))
    for path in ("pyproject.toml", "setup.py", "README.md", "src/", "native/"):  # README.md: pyproject's readme
        assert path in copied.split(), f"the builder does not COPY {path}"
    assert PYPROJECT["project"]["readme"] == "README.md"
    setup_sources = set(re.findall(r'"(native/[^"]+\.c)"', (ROOT / "setup.py").read_text()))
    assert setup_sources and all((ROOT / s).is_file() for s in setup_sources)  # all under the COPY'd native/
    assert any(re.search(r"\bpip wheel\b.*\s\.(\s|$)", run) for run in builder.all("RUN"))
    # it checks the shared libpython the private engine needs before building
    assert any("Py_ENABLE_SHARED" in run for run in builder.all("RUN"))
    # the runtime stage takes the wheel from the builder and nothing else
    final = dockerfile.final
    takes = [a for a in final.all("RUN") + final.all("COPY") if "from=builder" in a]
    assert takes and all("/wheels" in a for a in takes)


def test_both_stages_are_official_python_3_11_slim(dockerfile: Dockerfile) -> None:
    for stage in dockerfile.stages:
        image = dockerfile.expand(stage.base)
        assert re.fullmatch(r"python:3\.11-slim(-\w+)?", image), image
    # the version ./dev sets up for torch (.venv: 3.11), within the project's requires-python
    assert re.search(r"find_python 3\.11\b", (ROOT / "dev").read_text())
    assert PYPROJECT["project"]["requires-python"] == ">=3.11"


def test_torch_is_the_cpu_build_pinned_as_dev_pins_it(dockerfile: Dockerfile) -> None:
    pins = set(re.findall(r"torch==([0-9][0-9A-Za-z.+]*)", (ROOT / "dev").read_text()))
    assert len(pins) == 1, f"./dev pins torch {pins or 'nowhere'}"
    (dev_pin,) = pins
    installs = pip_installs(dockerfile.final, dockerfile)
    torch_alone = [words for words in installs if any(w.startswith("torch") for w in words)
                   and "--index-url" in words]
    assert len(torch_alone) == 1, installs
    words = torch_alone[0]
    assert words[words.index("--index-url") + 1] == "https://download.pytorch.org/whl/cpu"
    assert [w for w in words if w.startswith("torch")] == [f"torch=={dev_pin}"]
    # every other mention of torch in an install is the same pin (so pip keeps the CPU build)
    for words in installs:
        for w in words:
            if w.startswith("torch"):
                assert w == f"torch=={dev_pin}", words


def test_project_installed_from_its_own_metadata(dockerfile: Dockerfile) -> None:
    """pip installs the wheel built from pyproject.toml (its dependency list, its extras) and the
    torch pin: no requirements file, no hand-written copy of the dependencies."""
    text = (ROOT / "docker" / "Dockerfile").read_text()
    assert "requirements" not in text.lower()
    installs = pip_installs(dockerfile.final, dockerfile)
    wheels = [w for words in installs for w in words if "aserve-" in w and ".whl" in w]
    assert len(wheels) == 1, installs
    extras = re.fullmatch(r".*\.whl\)?\[([\w,]+)\]", wheels[0])
    assert extras, wheels[0]
    declared = PYPROJECT["project"]["optional-dependencies"]
    missing = [e for e in extras[1].split(",") if e not in declared]
    assert not missing, f"the image installs extras pyproject.toml does not declare: {missing}"
    assert "torch" in extras[1].split(",")
    for words in installs:
        packages = [w for w in words if not w.startswith("-") and "aserve-" not in w
                    and not w.startswith("https://")]
        assert all(p.startswith("torch==") for p in packages), f"pip installs {packages} by name"
    # none of pyproject's dependencies is named in the Dockerfile
    for requirement in PYPROJECT["project"]["dependencies"]:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement)[0]
        assert not re.search(rf"\b{re.escape(name)}\b", text, re.IGNORECASE), f"{name} listed by hand"


def test_runs_as_a_non_root_user(dockerfile: Dockerfile) -> None:
    final = dockerfile.final
    users = final.all("USER")
    assert users, "no USER: the server would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    assert any(re.search(rf"\buseradd\b.*\b{re.escape(user)}$", run) for run in final.all("RUN"))
    keywords = [kw for kw, _ in final.instructions]
    assert keywords.index("USER") < keywords.index("CMD")


def test_serves_models_on_port_8000_of_all_interfaces(dockerfile: Dockerfile) -> None:
    final = dockerfile.final
    variables = env(final)
    assert final.all("EXPOSE") == ["8000 8001"]  # HTTP, gRPC
    assert exec_form(final.all("CMD")[-1]) == ["aserve", "serve"]  # no flags: the ASERVE_* variables apply
    assert variables["ASERVE_PORT"] == "8000"
    assert variables["ASERVE_GRPC_PORT"] == "8001"
    assert variables["ASERVE_HOST"] == "0.0.0.0"
    assert variables["ASERVE_REPOSITORY"] == "/models"
    for key in variables:  # every ASERVE_* variable the image sets is a setting config.py reads
        if key.startswith("ASERVE_"):
            assert key.removeprefix("ASERVE_").lower() in FIELDS, key
    # the bundled examples are the default repository; a volume at /models replaces them
    assert "examples/ /models/" in final.all("COPY")


def test_glibc_tunables_set_at_start(dockerfile: Dockerfile) -> None:
    tunables = dict(item.split("=", 1) for item in env(dockerfile.final)["GLIBC_TUNABLES"].split(":"))
    assert tunables == REQUIRED  # what aserve serve would re-execute itself with


def test_healthcheck_asks_ready_with_the_standard_library(dockerfile: Dockerfile) -> None:
    (check,) = dockerfile.final.all("HEALTHCHECK")
    options, _, command = check.partition("CMD")
    assert "--start-period=" in options  # models load before the server is ready
    argv = exec_form(command.strip())
    assert argv[:2] == ["python", "-c"]
    code = argv[2]
    assert "urllib.request" in code and "/v2/health/ready" in code
    assert "ASERVE_PORT" in code and "'8000'" in code  # the port the server listens on
    compile(code, "<healthcheck>", "exec")
    assert not re.search(r"\b(curl|wget)\b", check)


# ---- .dockerignore ----


def _pattern(line: str) -> re.Pattern[str]:
    """A .dockerignore pattern as Docker's pattern matcher reads it (`**` any directories)."""
    text = line.strip().strip("/")
    out, i = "", 0
    while i < len(text):
        if text.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif text.startswith("**", i):
            out, i = out + ".*", i + 2
        elif text[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif text[i] == "?":
            out, i = out + "[^/]", i + 1
        elif text[i] == "[":
            end = text.index("]", i)
            out, i = out + text[i:end + 1], end + 1
        else:
            out, i = out + re.escape(text[i]), i + 1
    return re.compile(out)


def ignored(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether the build context leaves `path` out: the last rule matching it or a parent wins."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    out = False
    for negated, pattern in rules:
        if any(pattern.fullmatch(p) for p in prefixes):
            out = not negated
    return out


@pytest.fixture(scope="module")
def rules() -> list[tuple[bool, re.Pattern[str]]]:
    out = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.append((line.startswith("!"), _pattern(line.removeprefix("!"))))
    return out


def test_dockerignore_keeps_what_the_image_copies(dockerfile: Dockerfile, rules) -> None:
    sources = []
    for stage in dockerfile.stages:
        for args in stage.all("COPY"):
            words = [w for w in args.split() if not w.startswith("--")]
            sources += [w.rstrip("/") for w in words[:-1]]
    assert set(sources) >= {"pyproject.toml", "setup.py", "README.md", "src", "native", "examples"}
    for source in sources:
        assert not ignored(source, rules), f"COPY {source}: .dockerignore leaves it out"
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("no git checkout to list the tracked files")
    tracked = subprocess.run(["git", "ls-files", "--", *sources], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    assert tracked
    left_out = [p for p in tracked if ignored(p, rules)]
    assert not left_out, f"tracked files the image needs but the context leaves out: {left_out}"


@pytest.mark.parametrize("path", [
    ".venv/bin/python", ".venv313/lib/python3.13/site-packages/x.py", ".git/HEAD", "build/lib/aserve/_native.so",
    "src/aserve.egg-info/PKG-INFO", "src/aserve/_native.cpython-311-x86_64-linux-gnu.so",
    "src/aserve/__pycache__/cli.cpython-311.pyc", "examples/mlp/__pycache__/model.cpython-311.pyc",
    "native/host/pool.o", ".pytest_cache/v/cache/nodeids", ".mypy_cache/3.11/x.json", ".ruff_cache/x",
    "benchmarks/results/batching.png", "benchmarks/results/scaling.json", "benchmarks/http.py", "tests/conftest.py",
    "loadtests/results/run_stats.csv", "docker/compose.yaml",
])
def test_dockerignore_leaves_out(path: str, rules) -> None:
    assert ignored(path, rules)
