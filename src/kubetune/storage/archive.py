"""Safe unpacking of .tar (.tar.gz, .tgz and tarfile's other compressions) and .zip archives, and packing a
directory as .tar.gz.

Archives come from buckets, web servers and registries, so they are treated as hostile. One is unpacked
into a private folder inside the destination first, member by member:

* names: no absolute paths, no ``..``, no NUL bytes, nothing that names the folder itself;
* every member is created anew (``O_EXCL``, ``O_NOFOLLOW``) below real folders: never written through a
  link, never over a member unpacked before it (a repeated name is refused, whatever the two types are);
* symbolic links must be relative and stay inside; a hard link becomes a copy of a regular file unpacked
  before it; device files, FIFOs and sockets are refused; set-uid, set-gid and sticky bits are dropped;
* limits: the bytes really written (never the sizes an archive declares), by default a multiple of the
  archive's own size, and the number of members;
* tar members also pass Python's ``data`` extraction filter where it exists (3.11.4+, 3.12+).

Links that each look safe alone can chain (``b -> .`` then ``x -> b/b/../../file``), so once every member is
written, every link's *final* target is resolved (``os.path.realpath``) and must lie inside. Only then are
the members moved into the destination, by renames that never follow a link; when that merge with what the
destination already holds would make a link resolve outside it, the move is undone. A refused or failed
unpack leaves the destination as it was.
"""

from __future__ import annotations

import errno
import gzip
import lzma
import os
import shutil
import stat
import tarfile
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import BinaryIO, Iterator, NoReturn

from .. import constants as C
from ..errors import SourceError
from ._common import TransferStats, human_bytes, missing_dirs, remove_empty_dirs
from .uri import archive_kind, redact

__all__ = ["unpack", "unpack_members", "unpack_fetched", "merge_into", "pack_tar", "ArchiveError", "UnsafeArchive", "limits"]

_HINT = "the archive is unsafe or damaged; pack it again with relative paths, e.g. `kubetune push DIR URI --tar`"
_READ_HINT = "check that the URI names a .tar, .tar.gz, .tgz or .zip file and that it was written completely"
_DATA_FILTER = getattr(tarfile, "data_filter", None)  # Python 3.11.4+ / 3.12+; our own checks run everywhere
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_UNREADABLE = (tarfile.TarError, zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, gzip.BadGzipFile, zlib.error, lzma.LZMAError)
_TAR_HEADERS = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)


class ArchiveError(SourceError):
    """An archive could not be unpacked (unreadable, unsafe or too large); nothing of it was kept."""


class UnsafeArchive(ArchiveError):
    """A member would leave the destination, is a device, repeats a name, or the archive is too large."""


def limits(archive_size: int = 0) -> tuple[int, int]:
    """(most bytes, most members) an archive of ``archive_size`` bytes may unpack to.

    Bytes: ``KUBETUNE_MAX_UNPACK_BYTES`` when set, else ``STORAGE_UNPACK_RATIO`` times the archive's size but
    at least ``STORAGE_UNPACK_MIN_BYTES``. Members: ``KUBETUNE_MAX_UNPACK_FILES``, else ``STORAGE_MAX_UNPACK_FILES``.

    Raises:
        SourceError: one of the variables is set to something other than a positive whole number.
    """
    max_bytes = _env_count(C.ENV_MAX_UNPACK_BYTES, "bytes, e.g. 10737418240 for 10 GiB")
    if max_bytes is None:
        max_bytes = max(C.STORAGE_UNPACK_MIN_BYTES, C.STORAGE_UNPACK_RATIO * archive_size)
    max_files = _env_count(C.ENV_MAX_UNPACK_FILES, "members, e.g. 1000000")
    return max_bytes, C.STORAGE_MAX_UNPACK_FILES if max_files is None else max_files


def _env_count(name: str, unit: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw.replace("_", ""))
    except ValueError:
        value = 0
    if value < 1:
        raise SourceError(f"{name}={raw!r} is not a positive whole number", hint=f"set {name} to a number of {unit}, or unset it")
    return value


def unpack(archive: Path, dest: Path, *, label: str | None = None, kind: str | None = None) -> Path:
    """Unpack ``archive`` into the directory ``dest`` (created) after checking every member.

    Args:
        archive: the .tar/.tar.gz/.tgz/.zip file.
        dest: destination directory; members land inside it (merged with what it holds; members win).
        label: the URI to name in errors (defaults to the archive path).
        kind: ``tar`` or ``zip`` (default: from the file name).

    Returns:
        ``dest``.

    Raises:
        UnsafeArchive: a member is unsafe or a limit is exceeded; ``dest`` is left as it was.
        ArchiveError: the file is not a readable archive, or a member cannot be written; ``dest`` is left as it was.
    """
    unpack_members(archive, dest, label=label, kind=kind)
    return dest


def unpack_members(archive: Path, dest: Path, *, label: str | None = None, kind: str | None = None,
                   stats: TransferStats | None = None) -> list[str]:
    """:func:`unpack`, returning the names of the top-level entries the archive put into ``dest``; ``stats``
    counts the files it unpacked and their bytes (:meth:`TransferStats.unpacked`)."""
    archive, dest = Path(archive), Path(dest)
    label = redact(label or str(archive))
    kind = kind or archive_kind(archive.name) or ("zip" if zipfile.is_zipfile(archive) else "tar")
    made = missing_dirs(dest)
    work: Path | None = None
    guard: _Guard | None = None
    try:
        dest.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=C.STORAGE_UNPACK_PREFIX, dir=dest))
        guard = _Guard(work, label, archive.stat().st_size)
        _extract(archive, kind, guard)
        guard.check_tree()
        if stats is not None:
            sizes = [st.st_size for _, st in _walk(guard.root) if stat.S_ISREG(st.st_mode)]
            stats.unpacked(len(sizes), sum(sizes))
        names = sorted(os.listdir(work))
        merge_into(work, dest, label=label)
    except BaseException as e:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
        remove_empty_dirs(made)  # refused or failed: dest is left as it was
        if isinstance(e, OSError):  # a full disk, no permission, a name too long for this file system
            where = f" member '{guard.member}'" if guard and guard.member else ""
            raise ArchiveError(f"{label}: cannot unpack{where} into {dest}: {e.strerror or e}",
                               hint="check the free space and the permissions of the destination; nothing of the archive was kept") from e
        raise
    shutil.rmtree(work, ignore_errors=True)  # what is left are the emptied copies of merged folders
    return names


def unpack_fetched(archive: Path, dest: Path, *, label: str, stats: TransferStats | None = None) -> Path:
    """:func:`unpack` for fetch: returns ``dest``, or the one folder the archive holds when it holds exactly one
    (``model/``). All or nothing: a refused archive leaves ``dest`` as it was. ``stats`` counts what it unpacked."""
    names = unpack_members(archive, dest, label=label, stats=stats)
    if len(names) == 1 and (dest / names[0]).is_dir() and not (dest / names[0]).is_symlink():
        return dest / names[0]
    return dest


def _extract(archive: Path, kind: str, guard: "_Guard") -> None:
    try:
        if kind == "zip":
            _unpack_zip(archive, guard)
        else:
            _unpack_tar(archive, guard)
    except _HeaderTooBig as e:
        raise UnsafeArchive(f"{guard.label}: refusing to unpack: a long-name or pax header of {e.args[0]} bytes "
                            f"(at most {C.STORAGE_MAX_TAR_HEADER} are read)", hint=_HINT) from None
    except _UNREADABLE as e:  # gzip.BadGzipFile is an OSError too: caught here first
        raise ArchiveError(f"{guard.label}: not a readable {kind} archive ({e})", hint=_READ_HINT) from e


class _HeaderTooBig(Exception):
    pass


class _BoundedTarInfo(tarfile.TarInfo):
    """tarfile reads a GNU long name or a pax header whole into memory: a big one is refused before that."""

    @classmethod
    def frombuf(cls, buf, encoding, errors):  # type: ignore[no-untyped-def]
        info = super().frombuf(buf, encoding, errors)
        if info.type in _TAR_HEADERS and info.size > C.STORAGE_MAX_TAR_HEADER:
            raise _HeaderTooBig(info.size)
        return info


def _unpack_tar(archive: Path, guard: "_Guard") -> None:
    with tarfile.open(archive, mode="r:*", tarinfo=_BoundedTarInfo) as tf:
        for m in tf:
            parts = guard.name(m.name)
            if m.ischr() or m.isblk():
                guard.fail(m.name, "is a device file")
            elif m.isfifo():
                guard.fail(m.name, "is a FIFO")
            elif not (m.isdir() or m.isreg() or m.issym() or m.islnk()):
                guard.fail(m.name, f"has an unsupported type ({m.type!r})")
            if m.issym():
                guard.check_symlink(m.name, parts, m.linkname)
            elif m.islnk():
                guard.check_hardlink(m.name, m.linkname)
            if _DATA_FILTER is not None:  # a second opinion; ours above gave the clearer message where both refuse
                try:
                    m = _DATA_FILTER(m, guard.root)
                except tarfile.FilterError as e:
                    guard.fail(m.name, f"is refused by Python's tarfile data filter ({e})")
            if m.isdir():
                guard.mkdir(m.name, parts)
            elif m.isreg():
                src = tf.extractfile(m)
                assert src is not None
                guard.write(m.name, parts, src, m.mode)
            elif m.issym():
                guard.symlink(m.name, parts, m.linkname)
            else:
                guard.hardlink(m.name, parts, m.linkname)


def _unpack_zip(archive: Path, guard: "_Guard") -> None:
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()  # the central directory: read whole by zipfile, so counted before anything else
        if len(infos) > guard.max_files:
            guard.member = infos[guard.max_files].filename
            guard.too_many()
        declared = sum(i.file_size for i in infos)
        if declared > guard.max_bytes:
            guard.too_big(f"its members declare {declared} bytes, more than")
        for info in infos:
            name = info.filename
            parts = guard.name(name)
            mode = info.external_attr >> 16
            kind = stat.S_IFMT(mode)
            if info.is_dir() or kind == stat.S_IFDIR:
                guard.mkdir(name, parts)
            elif kind == stat.S_IFLNK:
                target = _zip_link_target(zf, info, guard)
                guard.check_symlink(name, parts, target)
                guard.symlink(name, parts, target)
            elif kind in (0, stat.S_IFREG):  # 0: made on a system without Unix modes
                with _zip_open(zf, info, guard) as src:
                    guard.write(name, parts, src, stat.S_IMODE(mode) or 0o644)
            elif kind in (stat.S_IFCHR, stat.S_IFBLK):
                guard.fail(name, "is a device file")
            elif kind == stat.S_IFIFO:
                guard.fail(name, "is a FIFO")
            else:
                guard.fail(name, f"has an unsupported type (mode {oct(mode)})")


def _zip_open(zf: zipfile.ZipFile, info: zipfile.ZipInfo, guard: "_Guard") -> BinaryIO:
    try:
        return zf.open(info)  # type: ignore[return-value]
    except (RuntimeError, NotImplementedError) as e:  # zipfile's words for "encrypted" and "unknown compression"
        raise ArchiveError(f"{guard.label}: cannot read member '{info.filename}': {e}",
                           hint="pack the archive again without a password and with deflate (or as .tar.gz)") from e


def _zip_link_target(zf: zipfile.ZipFile, info: zipfile.ZipInfo, guard: "_Guard") -> str:
    with _zip_open(zf, info, guard) as f:
        raw = f.read(C.STORAGE_MAX_LINK_TARGET + 1)  # bounded: a "link" can hide gigabytes of zeros
    if len(raw) > C.STORAGE_MAX_LINK_TARGET:
        guard.fail(info.filename, f"is a link whose target is longer than {C.STORAGE_MAX_LINK_TARGET} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        guard.fail(info.filename, "is a link whose target is not UTF-8 text")


class _Guard:
    """Writes members into the private root, checking each against the root and the limits."""

    def __init__(self, root: Path, label: str, archive_size: int) -> None:
        self.root = os.path.realpath(root)
        self.label = label
        self.archive_size = archive_size
        self.max_bytes, self.max_files = limits(archive_size)
        self.bytes = 0
        self.files = 0
        self.member = ""  # the member being unpacked, for messages about OS errors
        self.links: dict[str, str] = {}  # local path of each symlink -> its member name

    # --- refusals ---
    def fail(self, member: str, why: str) -> NoReturn:
        raise UnsafeArchive(f"{self.label}: refusing to unpack: member '{member}' {why}", hint=_HINT)

    def too_many(self) -> NoReturn:
        raise UnsafeArchive(
            f"{self.label}: refusing to unpack: member '{self.member}' exceeds the limit of {self.max_files} members "
            f"(set {C.ENV_MAX_UNPACK_FILES} to raise it)",
            hint=f"if you trust the archive, raise the limit, e.g. {C.ENV_MAX_UNPACK_FILES}={self.max_files * 10}",
        )

    def too_big(self, what: str) -> NoReturn:
        if os.environ.get(C.ENV_MAX_UNPACK_BYTES, "").strip():
            origin = f"set by {C.ENV_MAX_UNPACK_BYTES}"
        else:
            origin = (f"{C.STORAGE_UNPACK_RATIO} times the archive's {human_bytes(self.archive_size)}, at least "
                      f"{human_bytes(C.STORAGE_UNPACK_MIN_BYTES)}; set {C.ENV_MAX_UNPACK_BYTES} to raise it")
        raise UnsafeArchive(
            f"{self.label}: refusing to unpack: {what} the limit of {self.max_bytes} bytes "
            f"({human_bytes(self.max_bytes)}: {origin})",
            hint=f"if you trust the archive, raise the limit for this command, e.g. "
                 f"{C.ENV_MAX_UNPACK_BYTES}={max(self.max_bytes * 10, 1 << 30)} (bytes); on a cluster set it under kubernetes.env",
        )

    # --- names ---
    def name(self, name: str) -> list[str]:
        """Count member ``name`` and check it; returns its path parts below the root ([] is the root)."""
        self.member = name
        self.files += 1
        if self.files > self.max_files:
            self.too_many()
        if "\0" in name:
            self.fail(name, "has a NUL byte in its name")
        raw = name.replace("\\", "/")
        if raw.startswith("/") or (len(raw) > 1 and raw[1] == ":"):
            self.fail(name, "has an absolute path")
        parts = [p for p in raw.split("/") if p not in ("", ".")]
        if ".." in parts:
            self.fail(name, "contains '..' (it would leave the destination folder)")
        return parts

    def _parent(self, name: str, parts: list[str]) -> str:
        """The local path of ``parts``, creating its parent folders; every one must be a real folder."""
        if not parts:
            self.fail(name, "names the destination folder itself")
        cur = self.root
        for i, part in enumerate(parts[:-1]):
            cur = os.path.join(cur, part)
            try:
                st = os.lstat(cur)
            except FileNotFoundError:
                os.mkdir(cur, 0o755)
                continue
            if stat.S_ISLNK(st.st_mode):
                self.fail(name, f"would be written through the link '{'/'.join(parts[: i + 1])}' unpacked before it")
            if not stat.S_ISDIR(st.st_mode):
                self.fail(name, f"would be written inside '{'/'.join(parts[: i + 1])}', which is a file")
        return os.path.join(cur, parts[-1])

    def _repeated(self, name: str) -> NoReturn:
        self.fail(name, "has the name of a member unpacked before it (an archive may not replace its own members)")

    # --- members ---
    def mkdir(self, name: str, parts: list[str]) -> None:
        if not parts:
            return  # "./": the folder itself, which exists
        path = self._parent(name, parts)
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(path).st_mode):  # a folder listed again is harmless; a file or link is not
                self._repeated(name)

    def write(self, name: str, parts: list[str], src: BinaryIO, mode: int | None) -> None:
        path = self._parent(name, parts)
        try:
            fd = os.open(path, _CREATE, 0o600)
        except FileExistsError:
            self._repeated(name)
        with os.fdopen(fd, "wb") as out:
            while block := src.read(1 << 20):
                self.bytes += len(block)  # real bytes: a zip's declared sizes can lie
                if self.bytes > self.max_bytes:
                    self.too_big(f"member '{name}' takes what it unpacks past")
                out.write(block)
            os.fchmod(out.fileno(), ((mode if mode is not None else 0o644) & 0o755) | 0o600)

    def check_symlink(self, name: str, parts: list[str], target: str) -> None:
        """Refuse a link whose target is empty, absolute, or leaves the root from where it stands."""
        if not target:
            self.fail(name, "is a link without a target")
        if "\0" in target or len(target.encode("utf-8", "surrogateescape")) > C.STORAGE_MAX_LINK_TARGET:
            self.fail(name, "is a link with a malformed target")
        norm = target.replace("\\", "/")
        if norm.startswith("/") or (len(norm) > 1 and norm[1] == ":"):
            self.fail(name, f"is a link to an absolute path ({target})")
        level = len(parts) - 1  # folders below the root where the link stands
        for part in norm.split("/"):
            if part == "..":
                level -= 1
                if level < 0:
                    self.fail(name, f"is a link that leaves the destination folder ({target})")
            elif part not in ("", "."):
                level += 1
        here = os.path.join(self.root, *parts[:-1])
        if not _inside(os.path.realpath(os.path.join(here, target)), self.root):
            self.fail(name, f"is a link that leaves the destination folder ({target})")

    def symlink(self, name: str, parts: list[str], target: str) -> None:
        path = self._parent(name, parts)
        try:
            os.symlink(target, path)
        except FileExistsError:
            self._repeated(name)
        self.links[path] = name

    def _hardlink_source(self, name: str, linkname: str) -> str:
        norm = linkname.replace("\\", "/")
        parts = [p for p in norm.split("/") if p not in ("", ".")]
        if norm.startswith("/") or (len(norm) > 1 and norm[1] == ":"):
            self.fail(name, f"is a hard link to an absolute path ({linkname})")
        if ".." in parts or "\0" in linkname:
            self.fail(name, f"is a hard link that leaves the destination folder ({linkname})")
        src = os.path.join(self.root, *parts)
        try:
            regular = stat.S_ISREG(os.lstat(src).st_mode) and os.path.realpath(src) == src
        except OSError:
            regular = False
        if not regular:
            self.fail(name, f"is a hard link to '{linkname}', which is not a file unpacked before it")
        return src

    def check_hardlink(self, name: str, linkname: str) -> None:
        self._hardlink_source(name, linkname)

    def hardlink(self, name: str, parts: list[str], linkname: str) -> None:
        src = self._hardlink_source(name, linkname)
        with open(src, "rb") as f:  # a copy, not a link: a later write to one must not change the other
            self.write(name, parts, f, stat.S_IMODE(os.lstat(src).st_mode))

    # --- the finished tree ---
    def check_tree(self) -> None:
        """Resolve every link's final target (chains of links only show once all exist); only files,
        folders and links may be there."""
        for path, st in _walk(self.root):
            member = self.links.get(path) or os.path.relpath(path, self.root)
            if stat.S_ISLNK(st.st_mode):
                problem = _link_problem(path, self.root)
                if problem:
                    self.fail(member, problem)
            elif not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                self.fail(member, "is not a file, folder or link")


def _inside(real: str, root: str) -> bool:
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def _link_problem(path: str, root: str) -> str | None:
    """Why the link at ``path`` is unsafe in ``root`` (realpath'd), or None."""
    target = os.readlink(path)
    if os.path.isabs(target):
        return f"is a link to an absolute path ({target})"
    try:
        os.stat(path)
    except OSError as e:
        if e.errno not in (errno.ENOENT, errno.ENOTDIR):  # a loop (ELOOP) never resolves: refused, it hangs naive readers
            return f"is a link that does not resolve ({target}: {e.strerror})"
    if not _inside(os.path.realpath(path), root):
        return f"is a link that resolves outside the destination folder ({target})"
    return None


def _walk(top: str, skip: tuple[str, ...] = ()) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry below ``top`` with its lstat, never following a link."""
    stack = [top]
    while stack:
        with os.scandir(stack.pop()) as it:
            for entry in it:
                if entry.path in skip:
                    continue
                st = entry.stat(follow_symlinks=False)
                yield entry.path, st
                if stat.S_ISDIR(st.st_mode):
                    stack.append(entry.path)


def _escaping_links(dest: str, skip: tuple[str, ...]) -> set[tuple[str, str]]:
    """(path, target) of every link below ``dest`` whose final target is outside it."""
    return {(p, os.readlink(p)) for p, st in _walk(dest, skip) if stat.S_ISLNK(st.st_mode) and _link_problem(p, dest)}


def merge_into(src: Path, dest: Path, *, label: str) -> None:
    """Move the checked tree ``src`` into the folder ``dest`` by renames (same file system): folders merge, the
    entries of ``src`` replace those of the same name, links are moved, never followed.

    Into a folder that holds nothing (``src`` itself may be inside it), the checked tree is the result.
    Otherwise the links there may combine with the new entries (``b -> .`` arriving beside an older
    ``x -> b/b/../../f``), so the merge is undone when it leaves a link resolving outside ``dest`` that did not.

    Raises:
        UnsafeArchive: the merge would make a link leave ``dest``; ``dest`` is as it was.
    """
    root = os.path.realpath(dest)
    with os.scandir(dest) as it:
        fresh = all(os.path.realpath(e.path) == os.path.realpath(src) for e in it)
    aside = tempfile.mkdtemp(prefix=C.STORAGE_UNPACK_PREFIX, dir=dest)  # what the new entries replace
    skip = (os.path.realpath(src), os.path.realpath(aside))
    before = set() if fresh else _escaping_links(root, skip)
    journal: list[tuple[str, str | None]] = []
    try:
        _move_into(str(src), str(dest), aside, journal)
        if not fresh:
            new = sorted(_escaping_links(root, skip) - before)
            if new:
                path, target = new[0]
                raise UnsafeArchive(
                    f"{label}: refusing to unpack into {dest}: together with what the folder already holds, the link "
                    f"'{os.path.relpath(path, root)}' would resolve outside it ({target})",
                    hint="unpack into an empty folder, or remove the links the folder already holds",
                )
    except BaseException:
        for target, old in reversed(journal):
            if old is not None and not os.path.lexists(old):
                continue  # the original never moved aside
            if os.path.lexists(target):
                _remove(target)
            if old is not None:
                os.rename(old, target)
        raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def _move_into(src: str, dst: str, aside: str, journal: list[tuple[str, str | None]]) -> None:
    for name in sorted(os.listdir(src)):
        s, d = os.path.join(src, name), os.path.join(dst, name)
        try:
            existing = os.lstat(d).st_mode
        except FileNotFoundError:
            existing = None
        if existing is not None and stat.S_ISDIR(existing) and stat.S_ISDIR(os.lstat(s).st_mode):
            _move_into(s, d, aside, journal)  # both real folders: merge
            continue
        old = os.path.join(aside, str(len(journal))) if existing is not None else None
        journal.append((d, old))
        if old is not None:
            os.rename(d, old)
        os.rename(s, d)


def _remove(path: str) -> None:
    if stat.S_ISDIR(os.lstat(path).st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


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
