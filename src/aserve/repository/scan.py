"""Finding the models of a repository folder, and their versions.

Layouts (a model is a folder; its name is the model's name):

    <repo>/<name>/model.py            one version, version 1 (the flat layout)
    <repo>/<name>/config.toml         the model's config (optional)
    <repo>/<name>/<n>/model.py        version n (n = 1, 2, ...: the versioned layout)
    <repo>/<name>/<n>/model.pt        version n as a torch.package archive ([package] table)
    <repo>/<name>/<n>/config.toml     what version n changes of the model's config (optional)

A repository folder may itself be one model (as KServe's storage initializer leaves a
single model's files in /mnt/models): when it holds model.py or model.pt, or, given a
model name (`--model-name`), config.toml or numbered version folders, it is served as that
one model, named by `--model-name` or else by the folder's own name.

A folder that is neither, or a version folder with nothing to serve, is skipped, and the
scan says why (`RepositoryScan.skipped`), so that a misplaced file is reported rather
than silently ignored. A version whose config is invalid is kept with its error: it is
shown as unavailable, with the file and the field, and does not hide the other versions.

Each version has a fingerprint of its files (names, sizes, modification times) and of
its effective config: a rescan reloads exactly the versions whose fingerprint changed.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
from typing import Any

import msgspec

from .config import (
    CONFIG_FILE,
    MODEL_FIELDS,
    ConfigError,
    ModelConfig,
    check_version_table,
    load_table,
    merge_tables,
    to_config,
)

MODEL_FILE = "model.py"
PACKAGE_FILE = "model.pt"


class RepositoryError(ConfigError):
    """The repository folder itself is missing or unreadable."""


class VersionSource(msgspec.Struct, frozen=True, kw_only=True):
    """One version of a model on disk: its folder, effective config (or why it has none)."""

    version: int
    directory: str
    config: ModelConfig | None
    error: str | None = None  # why it cannot be loaded (config error, archive without [package], ...)
    fingerprint: str = ""

    @property
    def packaged(self) -> bool:
        """True when the version is a torch.package archive (its config has a [package] table)."""
        return self.config is not None and self.config.package is not None

    @property
    def model_file(self) -> str:
        """What the engine imports: the model.py, or the archive of a packaged version."""
        if self.config is not None and self.config.package is not None:
            archive = self.config.package.archive
            return archive if os.path.isabs(archive) else os.path.join(self.directory, archive)
        return os.path.join(self.directory, MODEL_FILE)


class Skipped(msgspec.Struct, frozen=True):
    """A folder or file of the repository that is not served, and why."""

    path: str
    reason: str


class ModelSource(msgspec.Struct, frozen=True, kw_only=True):
    """A model folder: its own config (or why it is invalid) and its versions on disk."""

    name: str
    directory: str
    config: ModelConfig | None  # the model's config.toml (with any override), None when invalid
    error: str | None = None
    versions: dict[int, VersionSource] = {}
    skipped: list[Skipped] = []

    def served(self) -> list[int]:
        """The versions its version policy serves, ascending (those with errors included:
        they are shown as unavailable)."""
        if self.config is None:
            return []
        return self.config.version_policy.select(self.versions)


class RepositoryScan(msgspec.Struct, frozen=True, kw_only=True):
    """Every model of a repository, and what was skipped."""

    models: dict[str, ModelSource]
    skipped: list[Skipped]


def _ignored(name: str) -> bool:
    return name.startswith((".", "_"))


def _fingerprint(directory: pathlib.Path, config: ModelConfig | None, *, flat_root: bool) -> str:
    """A digest of the folder's files (path, size, mtime) and of the effective config."""
    h = hashlib.blake2b(digest_size=16)
    for root, dirs, files in os.walk(directory):
        rel_root = os.path.relpath(root, directory)
        # a versioned model's numbered folders are other versions; caches are not the model
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__"
                         and not (flat_root and rel_root == "." and d.isdigit()))
        for f in sorted(files):
            if f.startswith(".") or f.endswith(".pyc") or (rel_root == "." and f == CONFIG_FILE):
                continue
            try:
                st = os.stat(os.path.join(root, f))
            except OSError:
                continue
            h.update(f"{rel_root}/{f}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    if config is not None:
        # the version's own behaviour only: moving a label or changing the policy reloads nothing
        h.update(msgspec.json.encode(msgspec.structs.replace(
            config, **{k: getattr(ModelConfig(), k) for k in MODEL_FIELDS})))
    return h.hexdigest()


def _version(folder: pathlib.Path, number: int, model_table: dict[str, Any], model_file: str,
             override: dict[str, Any] | None, *, flat: bool) -> VersionSource | Skipped:
    """One version folder (the model folder itself in the flat layout)."""
    error: str | None = None
    config: ModelConfig | None = None
    table = model_table
    where = model_file
    try:
        if not flat:
            version_file = folder / CONFIG_FILE
            own = load_table(version_file)
            if own:
                check_version_table(own, file=str(version_file))
                to_config(merge_tables({}, own), file=str(version_file))  # its own mistakes, named in its file
                table = merge_tables(model_table, own)
                where = f"{version_file} (over {model_file})"
        if override:
            table = merge_tables(table, override)
            where += " with the load request's config"
        config = to_config(table, file=where)
    except ConfigError as e:
        error = str(e)
    has_py = (folder / MODEL_FILE).is_file()
    has_pt = (folder / PACKAGE_FILE).is_file()
    if config is not None and config.package is None and not has_py:
        if has_pt:
            error = (f"{folder / PACKAGE_FILE}: a torch.package archive needs a [package] table in config.toml "
                     f"naming the model: object = \"some.module:Name\" or pickle = \"package.name/model.pkl\"")
        else:
            return Skipped(str(folder), f"version {number} has no {MODEL_FILE} or {PACKAGE_FILE}")
    if config is not None and config.package is not None and error is None:
        archive = pathlib.Path(config.package.archive)
        archive = archive if archive.is_absolute() else folder / archive
        if not archive.is_file():
            error = f"{archive}: the archive the [package] table names is not there"
    if config is None and not (has_py or has_pt):
        return Skipped(str(folder), f"version {number} has no {MODEL_FILE} or {PACKAGE_FILE}")
    return VersionSource(
        version=number, directory=str(folder.resolve()), config=config, error=error,
        fingerprint=_fingerprint(folder, config, flat_root=flat),
    )


def root_model(root: str | os.PathLike[str], model_name: str | None = None) -> str | None:
    """The name the repository folder `root` is served under when it is itself a model, else None.

    It is one when it holds model.py or model.pt, or, given `model_name`, config.toml or
    numbered version folders (without a name those stay what they were: a stray file, and
    models named 1, 2, ...); its name is `model_name`, or else the folder's own name."""
    base = pathlib.Path(root)
    if not base.is_dir():
        return None
    own = any((base / f).is_file() for f in (MODEL_FILE, PACKAGE_FILE))
    if not own and model_name is not None:
        try:
            own = (base / CONFIG_FILE).is_file() or any(c.name.isdigit() and c.is_dir() for c in base.iterdir())
        except OSError:
            own = False
    if not own:
        return None
    return model_name or base.resolve().name


def _not_a_model(root: str | os.PathLike[str], model_name: str) -> str:
    return (f"model repository {str(root)!r} was to be served as the one model {model_name!r} (--model-name), "
            f"but it holds no {MODEL_FILE}, {PACKAGE_FILE}, {CONFIG_FILE} or numbered version folders: point "
            f"it (KServe: the storageUri) at the model's own folder, or leave out --model-name to serve a "
            f"repository of model folders")


def scan_model(root: str | os.PathLike[str], name: str, *, override: dict[str, Any] | None = None,
               model_name: str | None = None) -> ModelSource | Skipped:
    """One model folder `<root>/<name>`: its config, its versions, what it skips; or `root`
    itself when it is a model (`root_model`) of that name.

    `override`: config fields laid over every version's config (a load request's)."""
    single = root_model(root, model_name)
    if single is not None:
        if name != single:
            return Skipped(str(pathlib.Path(root) / name),
                           f"the repository folder is itself the model {single!r} and serves no other")
        return _scan_folder(pathlib.Path(root).resolve(), name, override=override)
    if model_name is not None:
        return Skipped(str(root), _not_a_model(root, model_name))
    return _scan_folder(pathlib.Path(root) / name, name, override=override)


def _scan_folder(folder: pathlib.Path, name: str, *, override: dict[str, Any] | None) -> ModelSource | Skipped:
    """The model folder `folder`, served as `name`."""
    if not folder.is_dir():
        return Skipped(str(folder), "not a folder")
    model_file = str(folder / CONFIG_FILE)
    where = model_file + (" with the load request's config" if override else "")
    config: ModelConfig | None = None
    error: str | None = None
    model_table: dict[str, Any] = {}
    try:
        model_table = load_table(folder / CONFIG_FILE)
        config = to_config(merge_tables(model_table, override or {}), file=where)
    except ConfigError as e:
        error = str(e)
    try:
        children = sorted(folder.iterdir(), key=lambda p: p.name)
    except OSError as e:
        return Skipped(str(folder), f"cannot list: {e.strerror}")
    numbered = [c for c in children if c.is_dir() and c.name.isdigit()]
    skipped = [Skipped(str(c), "a version is a positive whole number without leading zeros")
               for c in numbered if int(c.name) < 1 or c.name != str(int(c.name))]
    numbered = [c for c in numbered if int(c.name) >= 1 and c.name == str(int(c.name))]
    versions: dict[int, VersionSource] = {}
    if numbered:
        for child in numbered:
            found = _version(child, int(child.name), model_table, model_file, override, flat=False)
            if isinstance(found, Skipped):
                skipped.append(found)
            else:
                versions[int(child.name)] = found
        for stray in (MODEL_FILE, PACKAGE_FILE):
            if (folder / stray).is_file():
                skipped.append(Skipped(str(folder / stray),
                                       "the model has version folders: only their files are served"))
        if not versions:
            return Skipped(str(folder), "no version folder holds a model.py or model.pt")
    else:
        if not ((folder / MODEL_FILE).is_file() or (folder / PACKAGE_FILE).is_file() or model_table.get("package")):
            return Skipped(str(folder), f"no {MODEL_FILE}, {PACKAGE_FILE} or numbered version folders")
        found = _version(folder, 1, model_table, model_file, override, flat=True)
        if isinstance(found, Skipped):
            return Skipped(str(folder), found.reason.replace("version 1 has", "has"))
        versions[1] = found
    return ModelSource(name=name, directory=str(folder.resolve()), config=config, error=error,
                       versions=versions, skipped=skipped)


def scan_repository(root: str | os.PathLike[str], overrides: dict[str, dict[str, Any]] | None = None, *,
                    model_name: str | None = None) -> RepositoryScan:
    """Every model folder of `root`, sorted by name, with its versions and configs parsed;
    or `root` alone when it is itself a model (`root_model`; `model_name` names it).

    A model or version whose config is invalid is still listed, with its error naming
    the file and field, so that one bad model does not hide the others. `overrides`:
    per model name, config fields a load request laid over its files."""
    base = pathlib.Path(root)
    if not base.is_dir():
        raise RepositoryError(f"model repository {str(base)!r} is not a folder")
    single = root_model(base, model_name)
    if single is not None:
        found = _scan_folder(base.resolve(), single, override=(overrides or {}).get(single))
        if isinstance(found, Skipped):
            return RepositoryScan(models={}, skipped=[found])
        return RepositoryScan(models={single: found}, skipped=list(found.skipped))
    if model_name is not None:
        raise RepositoryError(_not_a_model(base, model_name))
    try:
        children = sorted(base.iterdir(), key=lambda p: p.name)
    except OSError as e:
        raise RepositoryError(f"model repository {str(base)!r}: cannot list: {e.strerror}") from None
    models: dict[str, ModelSource] = {}
    skipped: list[Skipped] = []
    for child in children:
        if _ignored(child.name) or child.name == "__pycache__":
            continue
        if not child.is_dir():
            skipped.append(Skipped(str(child), "not a folder (a model is a folder holding model.py, model.pt "
                                               "or numbered version folders)"))
            continue
        found = scan_model(base, child.name, override=(overrides or {}).get(child.name))
        if isinstance(found, Skipped):
            skipped.append(found)
        else:
            models[found.name] = found
            skipped.extend(found.skipped)
    return RepositoryScan(models=models, skipped=skipped)
