"""Where OutputSync writes: a prefix of a bucket or a folder (s3://, file://), or tags of an OCI repository.

Each target offers the same five operations (:class:`kubetune.storage.schemes.OutputTarget`):
``complete_checkpoints()``, ``upload_checkpoint(dir, name)`` (completion marker last),
``download_checkpoint(name, into)``, ``delete_checkpoint(name)`` (marker first) and ``publish(run_dir)``.
:func:`make_target` asks the output URI's scheme for its target (``Scheme.output_target``); the schemes build
them from the classes here. The layouts are described in :mod:`kubetune.storage.sync`.

The run's record (spec.yaml, status.json, events.jsonl, result.json, logs/) is published through
:func:`_redacted_record`: the files are redacted where they are written already, and once more here, so a
line some library wrote around kubetune's own output never leaves the machine with a credential in it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from .. import constants as C
from ..errors import SourceError
from ..redact import redact_text
from . import schemes
from ._common import Progress, TransferStats, log, walk_files
from .location import Location
from .schemes import SYNC, OutputTarget
from .uri import redact

__all__ = ["make_target", "PrefixTarget", "S3Store", "FileStore", "OciTarget"]

_CKPT_RE = re.compile(r"^checkpoint-(\d+)$")
_RUN_FILES = (C.RESULT_FILE, C.SPEC_FILE, C.STATUS_FILE, C.EVENTS_FILE)
_ARTIFACT_DIRS = (C.ADAPTER_DIR, C.MODEL_DIR, C.MERGED_DIR)


def make_target(loc: Location) -> OutputTarget:
    """The target for an output URI (its scheme's ``output_target``); SourceError for schemes without SYNC."""
    scheme = schemes.get(loc.scheme, loc.uri)
    if not scheme.supports(SYNC):
        raise SourceError(f"{loc.safe}: output.uri must be {schemes.listing(schemes.supporting(SYNC))}")
    return scheme.output_target(loc)


def _step(name: str) -> int:
    m = _CKPT_RE.match(name)
    return int(m.group(1)) if m else -1


# --- s3:// and file:// ----------------------------------------------------------------------
class S3Store:
    """A bucket prefix as a store for :class:`PrefixTarget`."""

    def __init__(self, loc: Location) -> None:
        self.loc = loc
        self.bucket = loc.host
        self.base = loc.path.strip("/")

    def key(self, rel: str) -> str:
        """The object key of ``rel`` under the store's prefix."""
        return f"{self.base}/{rel}" if self.base else rel

    def list(self, rel_prefix: str) -> list[str]:
        """The relative names of the objects under ``rel_prefix``."""
        from . import s3

        root = self.key("")
        try:
            return [k[len(root):] for k, *_ in s3.list_objects(self.bucket, self.key(rel_prefix))]
        except Exception as e:
            raise s3.map_error(e, self.loc) from None

    def upload(self, files: list[tuple[Path, str]], last: list[tuple[Path, str]]) -> None:
        """Upload ``files`` (local path, relative name), then ``last`` (the completion markers) once the rest is there."""
        from . import s3

        stats = TransferStats(uri=self.loc.safe)
        s3.upload_files(self.bucket, [(p, self.key(r)) for p, r in files], self.loc, stats, Progress("", enabled=False),
                        last=[(p, self.key(r)) for p, r in last])

    def download(self, rel_prefix: str, into: Path) -> None:
        """Download everything under ``rel_prefix`` into the folder ``into``."""
        from . import s3

        sub = Location(uri=f"s3://{self.bucket}/{self.key(rel_prefix)}", scheme="s3", host=self.bucket, path=self.key(rel_prefix))
        s3.download(s3.probe(sub), sub, into, TransferStats(), Progress("", enabled=False))

    def delete(self, rel_prefix: str, first: list[str]) -> None:
        """Delete ``first`` (the completion markers, so nothing half-deleted looks complete), then the rest under ``rel_prefix``."""
        from . import s3

        s3.delete_prefix(self.bucket, self.key(rel_prefix), self.loc, first=[self.key(f) for f in first])


class FileStore:
    """A local folder as a store for :class:`PrefixTarget` (files written under a temporary name, then renamed)."""

    def __init__(self, loc: Location) -> None:
        self.loc = loc
        self.root = loc.local_path

    def list(self, rel_prefix: str) -> list[str]:
        """The relative names of the files under ``rel_prefix``."""
        base = self.root / rel_prefix
        return [f"{rel_prefix.rstrip('/')}/{rel}" for _, rel in walk_files(base)] if base.is_dir() else []

    def upload(self, files: list[tuple[Path, str]], last: list[tuple[Path, str]]) -> None:
        """Copy ``files`` then ``last`` (the completion markers) in, each under a temporary name renamed into place."""
        for path, rel in list(files) + list(last):
            out = self.root / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(out.name + C.STORAGE_PART_SUFFIX)
            shutil.copyfile(path, tmp)
            os.replace(tmp, out)

    def download(self, rel_prefix: str, into: Path) -> None:
        """Copy everything under ``rel_prefix`` into the folder ``into``."""
        from ._common import copy_tree

        copy_tree(self.root / rel_prefix, into)

    def delete(self, rel_prefix: str, first: list[str]) -> None:
        """Remove ``first`` (the completion markers), then the rest under ``rel_prefix``."""
        for f in first:
            (self.root / f).unlink(missing_ok=True)
        shutil.rmtree(self.root / rel_prefix, ignore_errors=True)


class PrefixTarget:
    """Checkpoints and artifacts under a prefix of a bucket or a folder: an :class:`~kubetune.storage.schemes.OutputTarget`.

    ``store`` gives four operations on paths relative to the prefix: ``list(rel_prefix) -> [rel]``,
    ``upload(files, last)`` (``(local path, rel)`` pairs; ``last`` only after all of ``files``),
    ``download(rel_prefix, into)`` and ``delete(rel_prefix, first)`` (``first`` before the rest).
    """

    def __init__(self, loc: Location, store: Any) -> None:
        self.loc = loc
        self.store = store

    def complete_checkpoints(self) -> list[str]:
        """The names of the checkpoints under the prefix whose completion marker is there, oldest first."""
        names = set()
        for rel in self.store.list(f"{C.CHECKPOINTS_DIR}/"):
            parts = rel.split("/")
            if len(parts) == 3 and parts[2] == C.CHECKPOINT_COMPLETE and _CKPT_RE.match(parts[1]):
                names.add(parts[1])
        return sorted(names, key=_step)

    def upload_checkpoint(self, local: Path, name: str) -> None:
        """Upload a complete checkpoint folder, its completion marker last."""
        rel = f"{C.CHECKPOINTS_DIR}/{name}"
        files = [(p, f"{rel}/{r}") for p, r in walk_files(local) if r != C.CHECKPOINT_COMPLETE]
        self.store.upload(files, [(local / C.CHECKPOINT_COMPLETE, f"{rel}/{C.CHECKPOINT_COMPLETE}")])

    def download_checkpoint(self, name: str, into: Path) -> None:
        """Download the checkpoint ``name`` into ``into``."""
        self.store.download(f"{C.CHECKPOINTS_DIR}/{name}/", into)

    def delete_checkpoint(self, name: str) -> None:
        """Delete the checkpoint ``name``, its completion marker first."""
        rel = f"{C.CHECKPOINTS_DIR}/{name}"
        self.store.delete(f"{rel}/", first=[f"{rel}/{C.CHECKPOINT_COMPLETE}"])

    def publish(self, run_dir: Path) -> None:
        """Upload the run's artifacts and record (logs, result.json, spec, status, events; credentials masked), ``DONE`` last."""
        files: list[tuple[Path, str]] = []
        for d in _ARTIFACT_DIRS:
            if (run_dir / d).is_dir():
                files += [(p, f"{d}/{r}") for p, r in walk_files(run_dir / d)]
        record = [(p, f"{C.LOGS_DIR}/{r}") for p, r in walk_files(run_dir / C.LOGS_DIR)] if (run_dir / C.LOGS_DIR).is_dir() else []
        record += [(run_dir / f, f) for f in _RUN_FILES if (run_dir / f).is_file()]
        with _done_marker() as done, _redacted_record(record) as record:
            self.store.upload(files + record, [(done, C.DONE_FILE)])


# Text files of a run's record larger than this are published as they are (redacted where written).
_REDACT_MAX_BYTES = 256 * 1024 * 1024


@contextlib.contextmanager
def _redacted_record(files: list[tuple[Path, str]]) -> Iterator[list[tuple[Path, str]]]:
    """The run's record files, each text file replaced by a redacted copy (binary ones, e.g. TensorBoard
    event files, as they are); the copies are removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="kubetune-record-") as tmp:
        out = []
        for i, (path, rel) in enumerate(files):
            try:
                text = path.read_text(encoding="utf-8") if path.stat().st_size <= _REDACT_MAX_BYTES else None
            except (UnicodeDecodeError, OSError):
                text = None
            masked = redact_text(text) if text is not None else None
            if masked is not None and masked != text:
                copy = Path(tmp) / f"{i}-{path.name}"
                copy.write_text(masked, encoding="utf-8")
                path = copy
            out.append((path, rel))
        yield out


class _done_marker:
    def __enter__(self) -> Path:
        import tempfile

        fd, name = tempfile.mkstemp(prefix="kubetune-done-")
        os.write(fd, f"{time.time():.3f}\n".encode())
        os.close(fd)
        self.path = Path(name)
        return self.path

    def __exit__(self, *exc: object) -> None:
        self.path.unlink(missing_ok=True)


# --- oci:// ----------------------------------------------------------------------------------
class OciTarget:
    """Checkpoints and artifacts as tags of one repository."""

    def __init__(self, loc: Location) -> None:
        from . import oci

        self.loc = loc
        self.repo, self.tag = oci._split(loc)
        if self.tag.startswith("sha256:"):
            raise SourceError(f"{loc.safe}: output.uri needs a tag, not a digest", hint="e.g. oci://REGISTRY/REPO:v1")

    def _at(self, tag: str) -> Location:
        uri = f"oci://{self.loc.host}/{self.repo}:{tag}"
        return Location(uri=uri, scheme="oci", host=self.loc.host, path=f"{self.repo}:{tag}")

    def complete_checkpoints(self) -> list[str]:
        """The names of the checkpoints pushed as tags of the repository, oldest first."""
        from . import oci

        pattern = re.compile(rf"^{re.escape(self.tag)}-(checkpoint-\d+)$")
        return sorted((m.group(1) for t in oci.list_tags(self.loc) if (m := pattern.match(t))), key=_step)

    def upload_checkpoint(self, local: Path, name: str) -> None:
        """Push a complete checkpoint folder as one artifact tagged with its name."""
        from . import oci

        files = [(p, r, C.OCI_MEDIA_FILE) for p, r in walk_files(local)]
        oci.push_files(self._at(f"{self.tag}-{name}"), files, TransferStats(), Progress("", enabled=False),
                       annotations={C.OCI_ANNOTATION_KIND: "checkpoint", C.OCI_ANNOTATION_TITLE: name})

    def download_checkpoint(self, name: str, into: Path) -> None:
        """Pull the checkpoint ``name`` into ``into``."""
        from . import oci

        at = self._at(f"{self.tag}-{name}")
        oci.download(at, oci.probe(at), into, TransferStats(), Progress("", enabled=False))

    def delete_checkpoint(self, name: str) -> None:
        """Delete the checkpoint's tag from the repository."""
        from . import oci

        if not oci.delete_tag(self.loc, f"{self.tag}-{name}"):
            log.debug("%s: registry does not allow deletes; keeping %s", self.loc.safe, name)

    def publish(self, run_dir: Path) -> None:
        """Push the run's results as one artifact under the URI's tag."""
        from . import oci

        base_model, method = _run_facts(run_dir)
        result = _read_json(run_dir / C.RESULT_FILE)
        notes = {
            C.OCI_ANNOTATION_CREATED: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            C.OCI_ANNOTATION_BASE_MODEL: base_model,
            C.OCI_ANNOTATION_METHOD: method,
        }
        config = json.dumps({"base_model": base_model, "method": method, "result": result}, default=str).encode()
        stats, bar = TransferStats(), Progress("", enabled=False)
        adapter, model = run_dir / C.ADAPTER_DIR, run_dir / C.MODEL_DIR
        if adapter.is_dir():
            files = []
            for p, rel in walk_files(adapter):
                media = {"adapter_config.json": C.OCI_MEDIA_ADAPTER_CONFIG,
                         "adapter_model.safetensors": C.OCI_MEDIA_ADAPTER_WEIGHTS}.get(rel)
                if media:
                    files.append((p, rel, media))
            if not any(m == C.OCI_MEDIA_ADAPTER_WEIGHTS for *_, m in files):
                raise SourceError(f"{run_dir / C.ADAPTER_DIR}: no adapter_model.safetensors to publish")
            oci.push_files(self.loc, files, stats, bar, config=(config, C.OCI_MEDIA_RUN_CONFIG),
                           artifact_type=C.OCI_ARTIFACT_ADAPTER, annotations={**notes, C.OCI_ANNOTATION_KIND: "adapter"})
        elif model.is_dir():
            oci.push_files(self.loc, [(p, r, C.OCI_MEDIA_FILE) for p, r in walk_files(model)], stats, bar,
                           config=(config, C.OCI_MEDIA_RUN_CONFIG), annotations={**notes, C.OCI_ANNOTATION_KIND: "model"})
        merged = run_dir / C.MERGED_DIR
        if merged.is_dir():
            oci.push_files(self._at(f"{self.tag}-merged"), [(p, r, C.OCI_MEDIA_FILE) for p, r in walk_files(merged)],
                           stats, bar, config=(config, C.OCI_MEDIA_RUN_CONFIG), annotations={**notes, C.OCI_ANNOTATION_KIND: "merged"})
        with _redacted_record([(run_dir / f, f) for f in _RUN_FILES if (run_dir / f).is_file()]) as record:
            if record:
                oci.push_files(self._at(f"{self.tag}-run"), [(p, r, C.OCI_MEDIA_FILE) for p, r in record], stats, bar,
                               annotations={**notes, C.OCI_ANNOTATION_KIND: "run"})


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _run_facts(run_dir: Path) -> tuple[str, str]:
    """(base model URI, method) from the run's spec.yaml, falling back to adapter_config.json."""
    base, method = "", ""
    try:
        import yaml

        spec = yaml.safe_load((run_dir / C.SPEC_FILE).read_text(encoding="utf-8")) or {}
        base = str((spec.get("model") or {}).get("source") or "")
        method = str((spec.get("method") or {}).get("type") or "")
    except Exception:  # a missing or odd spec only costs the annotation
        pass
    if not base:
        base = str(_read_json(run_dir / C.ADAPTER_DIR / "adapter_config.json").get("base_model_name_or_path") or "")
    return redact(base), method
