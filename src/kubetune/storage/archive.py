"""Safe unpacking of .tar, .tar.gz, .tgz and .zip archives, and packing a directory as .tar.gz.

Archives come from buckets, web servers and registries, so every member is checked before anything is
written: no absolute paths, no ``..``, no links that point (or write) outside the folder, no device
files or FIFOs, and limits on the total size and the number of members (zip bombs). The checks are
ours, not tarfile's extraction filters, so they behave the same on every Python version.
"""

from __future__ import annotations

import gzip
import os
import shutil
import stat
import tarfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from .. import constants as C
from ..errors import SourceError
from .uri import archive_kind, redact

__all__ = ["unpack", "pack_tar", "UnsafeArchive", "limits"]

_HINT = "the archive is unsafe or damaged; pack it again with relative paths, e.g. `kubetune push DIR URI --tar`"


class UnsafeArchive(SourceError):
    """An archive member would leave the destination, is a device, or the archive is too large."""


def limits() -> tuple[int, int]:
    """(most bytes, most members) one archive may unpack to, from the environment or the defaults."""
    def env_int(name: str, default: int) -> int:
        try:
            return int(os.environ.get(name, default))
        except ValueError:
            return default

    return env_int(C.ENV_MAX_UNPACK_BYTES, C.STORAGE_MAX_UNPACK_BYTES), env_int(C.ENV_MAX_UNPACK_FILES, C.STORAGE_MAX_UNPACK_FILES)


def unpack(archive: Path, dest: Path, *, label: str | None = None, kind: str | None = None) -> Path:
    """Unpack ``archive`` into the directory ``dest`` (created) after checking every member.

    Args:
        archive: the .tar/.tar.gz/.tgz/.zip file.
        dest: destination directory; members land inside it.
        label: the URI to name in errors (defaults to the archive path).
        kind: ``tar`` or ``zip`` (default: from the file name).

    Returns:
        ``dest``.

    Raises:
        UnsafeArchive: a member is unsafe or a limit is exceeded (nothing outside ``dest`` is touched).
        SourceError: the file is not a readable archive.
    """
    label = redact(label or str(archive))
    kind = kind or archive_kind(archive.name) or ("zip" if zipfile.is_zipfile(archive) else "tar")
    dest.mkdir(parents=True, exist_ok=True)
    max_bytes, max_files = limits()
    guard = _Guard(dest, label, max_bytes, max_files)
    try:
        if kind == "zip":
            _unpack_zip(archive, guard)
        else:
            _unpack_tar(archive, guard)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise SourceError(f"{label}: not a readable {kind} archive ({e})", hint=_HINT) from e
    return dest


class _Guard:
    """Checks members against the destination and the limits, as they are written."""

    def __init__(self, dest: Path, label: str, max_bytes: int, max_files: int) -> None:
        self.root = Path(os.path.realpath(dest))
        self.label = label
        self.max_bytes = max_bytes
        self.max_files = max_files
        self.bytes = 0
        self.files = 0

    def fail(self, member: str, why: str) -> None:
        raise UnsafeArchive(f"{self.label}: refusing to unpack: member '{member}' {why}", hint=_HINT)

    def target(self, name: str) -> Path:
        """The local path of member ``name``; fails on absolute paths, '..' and writes through links."""
        raw = name.replace("\\", "/")
        if raw.startswith("/") or PurePosixPath(raw).is_absolute() or (len(raw) > 1 and raw[1] == ":"):
            self.fail(name, "has an absolute path")
        parts = [p for p in raw.split("/") if p not in ("", ".")]
        if any(p == ".." for p in parts):
            self.fail(name, "contains '..' (it would leave the destination folder)")
        self.files += 1
        if self.files > self.max_files:
            self.fail(name, f"exceeds the limit of {self.max_files} members (set {C.ENV_MAX_UNPACK_FILES} to raise it)")
        path = self.root.joinpath(*parts) if parts else self.root
        # A link unpacked earlier must not carry a later member outside the folder.
        if not self.inside(os.path.realpath(path.parent)):
            self.fail(name, "would be written through a link that leaves the destination folder")
        return path

    def inside(self, real: str) -> bool:
        return real == str(self.root) or real.startswith(str(self.root) + os.sep)

    def check_link(self, name: str, path: Path, link_target: str, *, hard: bool) -> None:
        if not link_target:
            self.fail(name, "is a link without a target")
        if hard:
            resolved = os.path.realpath(self.root / link_target)
        else:
            if os.path.isabs(link_target):
                self.fail(name, f"is a link to an absolute path ({link_target})")
            resolved = os.path.realpath(path.parent / link_target)
        if not self.inside(resolved):
            self.fail(name, f"is a link that leaves the destination folder ({link_target})")

    def count(self, nbytes: int, name: str) -> None:
        self.bytes += nbytes
        if self.bytes > self.max_bytes:
            self.fail(name, f"takes the archive past the limit of {self.max_bytes} bytes (set {C.ENV_MAX_UNPACK_BYTES} to raise it)")


def _copy_stream(src, path: Path, guard: _Guard, name: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.is_dir():
        guard.fail(name, "replaces a link or directory unpacked before it")
    with open(path, "wb") as out:
        while True:
            block = src.read(1 << 20)
            if not block:
                break
            guard.count(len(block), name)  # real bytes: a zip's declared sizes can lie
            out.write(block)


def _unpack_tar(archive: Path, guard: _Guard) -> None:
    with tarfile.open(archive, mode="r:*") as tf:
        for m in tf:
            path = guard.target(m.name)
            if m.isdir():
                if path.is_symlink():
                    guard.fail(m.name, "replaces a link unpacked before it")
                path.mkdir(parents=True, exist_ok=True)
            elif m.isfile():
                src = tf.extractfile(m)
                assert src is not None
                _copy_stream(src, path, guard, m.name)
                os.chmod(path, (m.mode & 0o755) | 0o600)
            elif m.issym():
                guard.check_link(m.name, path, m.linkname, hard=False)
                path.parent.mkdir(parents=True, exist_ok=True)
                if path.exists() or path.is_symlink():
                    guard.fail(m.name, "replaces a file unpacked before it")
                os.symlink(m.linkname, path)
            elif m.islnk():
                guard.check_link(m.name, path, m.linkname, hard=True)
                source = guard.target(m.linkname)
                if not source.is_file() or source.is_symlink():
                    guard.fail(m.name, f"is a hard link to '{m.linkname}', which is not a file unpacked before it")
                path.parent.mkdir(parents=True, exist_ok=True)
                guard.count(source.stat().st_size, m.name)
                shutil.copyfile(source, path)  # a copy, not a link: later writes must not alias
            elif m.ischr() or m.isblk():
                guard.fail(m.name, "is a device file")
            elif m.isfifo():
                guard.fail(m.name, "is a FIFO")
            else:
                guard.fail(m.name, f"has an unsupported type ({m.type!r})")


def _unpack_zip(archive: Path, guard: _Guard) -> None:
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            path = guard.target(info.filename)
            mode = info.external_attr >> 16
            if info.is_dir():
                path.mkdir(parents=True, exist_ok=True)
            elif stat.S_ISLNK(mode):
                target = zf.read(info).decode("utf-8", "replace")
                guard.check_link(info.filename, path, target, hard=False)
                path.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(target, path)
            elif mode and (stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode)):
                guard.fail(info.filename, "is a device file or FIFO")
            else:
                with zf.open(info) as src:
                    _copy_stream(src, path, guard, info.filename)


def pack_tar(src: Path, out: Path) -> Path:
    """Pack a directory's contents (relative names, no top folder) or one file into ``out`` (.tar.gz)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + C.STORAGE_PART_SUFFIX)
    # compresslevel 1: model weights barely compress; speed matters more than a few percent.
    with tarfile.open(tmp, "w:gz", compresslevel=1) as tf:
        if src.is_file():
            tf.add(src, arcname=src.name)
        else:
            for entry in sorted(src.iterdir()):
                tf.add(entry, arcname=entry.name)
    os.replace(tmp, out)
    return out
