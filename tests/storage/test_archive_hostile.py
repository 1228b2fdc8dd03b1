"""Hostile archives from the security review (issue 14, "Trust"): link chains, repeated names, bombs, leftovers.

Every refused archive must leave the destination (and the cache) exactly as it was, and nothing outside the
destination may ever be read or written through what the archive unpacked.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import stat
import tarfile
import tracemalloc
import zipfile
from pathlib import Path

import pytest
from kt_storage_util import make_tree, read_tree

from kubetune import constants as C
from kubetune.errors import SourceError
from kubetune.storage import fetch
from kubetune.storage.archive import ArchiveError, UnsafeArchive, pack_tar, unpack

SECRET = b"host secret: never readable through an unpacked archive"


# --- archive builders --------------------------------------------------------------------------
def _member(name: str, kind: str = "file", data: bytes | str = b"", mode: int = 0o644) -> tuple:
    return (name, kind, data.encode() if isinstance(data, str) else data, mode)


def _tar(path: Path, members: list[tuple], mode: str = "w:gz") -> Path:
    types = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "hard": tarfile.LNKTYPE,
             "fifo": tarfile.FIFOTYPE, "chr": tarfile.CHRTYPE, "blk": tarfile.BLKTYPE}
    with tarfile.open(path, mode) as tf:
        for name, kind, data, perm in members:
            info = tarfile.TarInfo(name)
            info.type = types[kind]
            info.mode = perm
            if kind in ("sym", "hard"):
                info.linkname = data.decode()
                tf.addfile(info)
            elif kind == "file":
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
            else:
                tf.addfile(info)
    return path


def _zip(path: Path, members: list[tuple]) -> Path:
    kinds = {"file": stat.S_IFREG, "dir": stat.S_IFDIR, "sym": stat.S_IFLNK, "fifo": stat.S_IFIFO, "chr": stat.S_IFCHR}
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, kind, data, perm in members:
            info = zipfile.ZipInfo(name + ("/" if kind == "dir" and not name.endswith("/") else ""))
            info.external_attr = (kinds[kind] | perm) << 16
            with pytest.warns(UserWarning, match="Duplicate name") if name in zf.NameToInfo else contextlib.nullcontext():
                zf.writestr(info, data)
    return path


def _archive(tmp_path: Path, fmt: str, members: list[tuple]) -> Path:
    return _tar(tmp_path / "evil.tar.gz", members) if fmt == "tar" else _zip(tmp_path / "evil.zip", members)


def _snapshot(root: Path) -> dict[str, str]:
    """Every entry below root (links not followed): what a refused unpack must leave unchanged."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            out[str(p.relative_to(root))] = os.readlink(p) if p.is_symlink() else ("dir" if p.is_dir() else p.read_bytes().hex())
    return out


@pytest.fixture
def box(tmp_path):
    """A destination three folders below a host file the archives try to reach (``../../../secret.txt``)."""
    (tmp_path / "secret.txt").write_bytes(SECRET)
    return tmp_path / "a" / "b" / "out"


# --- (3) link chains ---------------------------------------------------------------------------
CHAINS = {
    # each member looks safe alone: "b -> ." stays inside, and "b/b/b/../../../secret.txt" is "secret.txt" on paper
    "link-then-dot": [_member("train.jsonl", "sym", "b/b/b/../../../secret.txt"), _member("b", "sym", ".")],
    "dot-then-link": [_member("b", "sym", "."), _member("train.jsonl", "sym", "b/b/b/../../../secret.txt")],
    "nested-chain": [_member("d/x", "sym", "../c/c/c/../../../secret.txt"), _member("c", "sym", "d"), _member("d/c", "sym", ".")],
    "dir-link": [_member("data", "sym", "b/b/b/../../.."), _member("b", "sym", ".")],
    "loop": [_member("a", "sym", "a/../secret.txt")],
}


@pytest.mark.parametrize("fmt", ["tar", "zip"])
@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_link_chains_refused_after_the_last_member(box, tmp_path, fmt, chain):
    arc = _archive(tmp_path, fmt, CHAINS[chain])
    with pytest.raises(UnsafeArchive) as e:
        unpack(arc, box, label="https://example.com/evil")
    msg = str(e.value)
    assert msg.startswith("https://example.com/evil: refusing to unpack: member '") and "hint:" in msg
    assert "link" in msg
    assert not box.exists() and not (tmp_path / "a").exists()  # nothing left, not even the folders made for it


@pytest.mark.parametrize("fmt", ["tar", "zip"])
def test_link_chain_refused_through_fetch_leaves_no_trace(tmp_path, monkeypatch, fmt):
    """The review's case end to end: a local archive through the cache, and into a destination."""
    monkeypatch.setenv(C.ENV_HOME, str(tmp_path / "home"))
    (tmp_path / "secret.txt").write_bytes(SECRET)
    src = tmp_path / "in"
    src.mkdir()
    # as many "b/" as "../": inside on paper; with b -> "." it climbs 40 folders (to /), then down to the secret
    target = "b/" * 40 + "../" * 40 + str(tmp_path / "secret.txt").lstrip("/")
    arc = _archive(src, fmt, [_member("train.jsonl", "sym", target), _member("b", "sym", ".")])
    with pytest.raises(UnsafeArchive, match="train.jsonl"):
        fetch(arc)  # into the cache
    cache = tmp_path / "home" / C.CACHE_DIR
    assert not cache.exists()  # this fetch made it, and took it away again
    cache.mkdir()
    with pytest.raises(UnsafeArchive, match="train.jsonl"):
        fetch(arc)
    assert cache.is_dir() and list(cache.iterdir()) == []  # one that was there stays
    dest = tmp_path / "dest" / "sub"
    with pytest.raises(UnsafeArchive, match="train.jsonl"):
        fetch(arc, dest)
    assert not (tmp_path / "dest").exists()
    assert [p.name for p in tmp_path.rglob("*") if "kubetune" in p.name and p.name != "home"] == []


def test_chain_across_two_archives_into_one_folder(box, tmp_path):
    """The second archive completes a chain the first one began: refused, and the folder is as before."""
    first = _tar(tmp_path / "1.tar", [_member("x", "sym", "b/b/b/../../../secret.txt"), _member("keep.txt", "file", "k")], "w")
    unpack(first, box)
    before = _snapshot(box)
    second = _tar(tmp_path / "2.tar", [_member("b", "sym", "."), _member("keep.txt", "file", "replaced")], "w")
    with pytest.raises(UnsafeArchive, match="together with what the folder already holds.*'x'"):
        unpack(second, box)
    assert _snapshot(box) == before
    # and the other way round: a link into a chain the folder already holds
    other = tmp_path / "other"
    unpack(_tar(tmp_path / "3.tar", [_member("b", "sym", ".")], "w"), other)
    with pytest.raises(UnsafeArchive):
        unpack(_tar(tmp_path / "4.tar", [_member("y", "sym", "b/../secret.txt")], "w"), other)
    assert _snapshot(other) == {"b": "."}


def test_merge_into_a_folder_replaces_members_and_keeps_the_rest(tmp_path):
    dest = make_tree(tmp_path / "dest", {"old.txt": b"old", "sub/kept.txt": b"kept", "sub/over.txt": b"before"})
    (dest / "link").symlink_to("old.txt")
    arc = _tar(tmp_path / "m.tar", [_member("sub/over.txt", "file", "after"), _member("link", "file", "now a file"),
                                    _member("sub/new", "sym", "kept.txt")], "w")
    unpack(arc, dest)
    assert read_tree(dest) == {"old.txt": b"old", "sub/kept.txt": b"kept", "sub/over.txt": b"after", "link": b"now a file",
                               "sub/new": b"kept"}
    assert not (dest / "link").is_symlink() and os.readlink(dest / "sub" / "new") == "kept.txt"
    assert [p for p in dest.iterdir() if p.name.startswith(".")] == []


# --- (3) the rest of the family ------------------------------------------------------------------
HOSTILE = {
    "abs-link": ([_member("l", "sym", "/etc/passwd")], "absolute path"),
    "abs-link-backslash": ([_member("l", "sym", "\\etc\\passwd")], "absolute path"),
    "link-to-device": ([_member("l", "sym", "../../../../../../../../dev/zero")], "leaves the destination"),
    "link-up-from-subdir": ([_member("s/l", "sym", "../../secret.txt")], "leaves the destination"),
    "fifo": ([_member("f", "fifo")], "FIFO"),
    "chardev": ([_member("d", "chr")], "device file"),
    "dot-file": ([_member(".", "file", "x")], "names the destination folder itself"),
    "dotdot": ([_member("..", "dir")], "contains '..'"),
    "repeated-file": ([_member("x", "file", "1"), _member("x", "file", "2")], "name of a member unpacked before it"),
    "file-then-link": ([_member("x", "file", "1"), _member("x", "sym", "y")], "name of a member unpacked before it"),
    "dir-then-link": ([_member("d", "dir"), _member("d", "sym", "."), _member("d/x", "file", "x")], "name of a member"),
    "dir-then-file": ([_member("d/x", "file", "1"), _member("d", "file", "2")], "name of a member"),
    "write-through-inside-link": ([_member("real", "dir"), _member("l", "sym", "real"), _member("l/x", "file", "x")],
                                  "written through the link 'l'"),
    "file-inside-file": ([_member("f", "file", "1"), _member("f/x", "file", "2")], "which is a file"),
}


@pytest.mark.parametrize("fmt", ["tar", "zip"])
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_members_refused_and_nothing_left(box, tmp_path, fmt, case):
    members, why = HOSTILE[case]
    box.mkdir(parents=True)
    (box / "mine.txt").write_bytes(b"kept")
    arc = _archive(tmp_path, fmt, members)
    with pytest.raises(UnsafeArchive) as e:
        unpack(arc, box, label="s3://b/evil")
    assert why in str(e.value)
    assert _snapshot(box) == {"mine.txt": b"kept".hex()}


def test_zip_file_then_symlink_of_the_same_name_is_a_clean_error(tmp_path):
    """(12a): it was a FileExistsError traceback."""
    arc = _zip(tmp_path / "dup.zip", [_member("train.jsonl", "file", "{}"), _member("train.jsonl", "sym", "other.jsonl")])
    with pytest.raises(UnsafeArchive, match="member 'train.jsonl' has the name of a member unpacked before it"):
        unpack(arc, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_hard_links(tmp_path):
    ok = _tar(tmp_path / "ok.tar", [_member("a.txt", "file", "A", 0o4755), _member("h", "hard", "a.txt")], "w")
    out = unpack(ok, tmp_path / "ok")
    assert (out / "h").read_bytes() == b"A" and not os.path.samefile(out / "h", out / "a.txt")  # a copy
    for name, members in {
        "to-link": [_member("a.txt", "file", "A"), _member("l", "sym", "a.txt"), _member("h", "hard", "l")],
        "through-link": [_member("d/a.txt", "file", "A"), _member("l", "sym", "d"), _member("h", "hard", "l/a.txt")],
        "to-self": [_member("h", "hard", "h")],
        "to-missing": [_member("h", "hard", "nothing")],
        "outside": [_member("h", "hard", "../../../secret.txt")],
        "absolute": [_member("h", "hard", "/etc/passwd")],
    }.items():
        with pytest.raises(UnsafeArchive, match="hard link"):
            unpack(_tar(tmp_path / f"{name}.tar", members, "w"), tmp_path / name)
        assert not (tmp_path / name).exists(), name


@pytest.mark.parametrize("fmt", ["tar", "zip"])
def test_setuid_bits_dropped_and_inner_links_kept(tmp_path, fmt):
    members = [_member("./", "dir"), _member("bin/run", "file", "#!/bin/sh\n", 0o6755), _member("bin/data", "file", "d", 0o1666),
               _member("bin/latest", "sym", "run"), _member("top", "sym", "."), _member("bin/up", "sym", "../bin/data"),
               _member("bin", "dir")]
    out = unpack(_archive(tmp_path, fmt, members), tmp_path / "out")
    assert stat.S_IMODE((out / "bin" / "run").stat().st_mode) == 0o755
    assert stat.S_IMODE((out / "bin" / "data").stat().st_mode) & 0o7022 == 0
    assert (out / "bin" / "latest").read_bytes() == b"#!/bin/sh\n" and (out / "top" / "bin" / "up").read_bytes() == b"d"


def test_zip_link_target_is_read_bounded(tmp_path):
    """A zip "link" member holding 32 MB is refused after reading a few kB, not read whole into memory."""
    path = tmp_path / "biglink.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        info = zipfile.ZipInfo("l")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        with zf.open(info, "w") as f:
            for _ in range(32):
                f.write(b"a" * (1 << 20))
    with pytest.raises(UnsafeArchive, match=f"longer than {C.STORAGE_MAX_LINK_TARGET} bytes"):
        unpack(path, tmp_path / "out")


def test_unreadable_and_encrypted_archives_are_clean_errors(tmp_path):
    (tmp_path / "cut.tar.gz").write_bytes(gzip.compress(b"x" * 10_000)[:200])
    with pytest.raises(ArchiveError, match="cut.tar.gz"):
        unpack(tmp_path / "cut.tar.gz", tmp_path / "o1")
    zipped = _zip(tmp_path / "e.zip", [_member("a.txt", "file", "secret")])
    raw = bytearray(zipped.read_bytes())
    raw[6] |= 1  # general purpose flag: encrypted (local header)
    i = raw.find(b"PK\x01\x02")
    raw[i + 8] |= 1  # and in the central directory
    zipped.write_bytes(bytes(raw))
    with pytest.raises(ArchiveError, match="cannot read member 'a.txt'"):
        unpack(zipped, tmp_path / "o2")
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


# --- (12c) limits relative to the archive's size -----------------------------------------------
def test_default_limit_is_a_multiple_of_the_archive_size(tmp_path, monkeypatch):
    monkeypatch.delenv(C.ENV_MAX_UNPACK_BYTES, raising=False)
    bomb = tmp_path / "bomb.tar.gz"
    with tarfile.open(bomb, "w:gz", compresslevel=9) as tf:
        info = tarfile.TarInfo("zeros.bin")
        info.size = C.STORAGE_UNPACK_MIN_BYTES + (8 << 20)
        tf.addfile(info, io.BytesIO(bytes(info.size)))
    assert bomb.stat().st_size * C.STORAGE_UNPACK_RATIO < C.STORAGE_UNPACK_MIN_BYTES  # the floor is the limit here
    with pytest.raises(UnsafeArchive) as e:
        unpack(bomb, tmp_path / "out", label="s3://bucket/bomb.tar.gz")
    msg = str(e.value)
    assert msg.startswith("s3://bucket/bomb.tar.gz: refusing to unpack: member 'zeros.bin'")
    assert f"limit of {C.STORAGE_UNPACK_MIN_BYTES} bytes" in msg and C.ENV_MAX_UNPACK_BYTES in msg
    assert f"{C.ENV_MAX_UNPACK_BYTES}=" in e.value.hint
    assert not (tmp_path / "out").exists()
    monkeypatch.setenv(C.ENV_MAX_UNPACK_BYTES, str(C.STORAGE_UNPACK_MIN_BYTES + (8 << 20)))  # the one override
    assert (unpack(bomb, tmp_path / "out") / "zeros.bin").stat().st_size == C.STORAGE_UNPACK_MIN_BYTES + (8 << 20)


def test_limit_grows_with_the_archive(tmp_path, monkeypatch):
    """Past the floor the limit is the ratio times the archive: 700 kB of noise plus 100 MB of zeros (an 800 kB
    archive) is refused, 70 MiB that does not compress is fine."""
    monkeypatch.delenv(C.ENV_MAX_UNPACK_BYTES, raising=False)
    bomb = tmp_path / "mixed.tar.gz"
    with tarfile.open(bomb, "w:gz", compresslevel=9) as tf:
        for name, data in (("noise.bin", os.urandom(700_000)), ("zeros.bin", bytes(100_000_000))):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    limit = C.STORAGE_UNPACK_RATIO * bomb.stat().st_size
    assert C.STORAGE_UNPACK_MIN_BYTES < limit < 100_000_000
    with pytest.raises(UnsafeArchive, match=f"member 'zeros.bin' .*limit of {limit} bytes"):
        unpack(bomb, tmp_path / "out")
    data = os.urandom(1 << 20) * 70
    arc = tmp_path / "big.tar"
    with tarfile.open(arc, "w") as tf:  # uncompressed: ratio 1
        info = tarfile.TarInfo("weights.bin")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    assert (unpack(arc, tmp_path / "out") / "weights.bin").stat().st_size == len(data)


def test_member_count_and_bad_settings(tmp_path, monkeypatch):
    with zipfile.ZipFile(tmp_path / "many.zip", "w") as zf:
        for i in range(30):
            zf.writestr(f"f{i}", b"")
    monkeypatch.setenv(C.ENV_MAX_UNPACK_FILES, "20")
    with pytest.raises(UnsafeArchive, match=f"limit of 20 members.*{C.ENV_MAX_UNPACK_FILES}"):
        unpack(tmp_path / "many.zip", tmp_path / "out")
    monkeypatch.setenv(C.ENV_MAX_UNPACK_BYTES, "10GB")
    with pytest.raises(SourceError, match=f"{C.ENV_MAX_UNPACK_BYTES}='10GB' is not a positive whole number"):
        unpack(tmp_path / "many.zip", tmp_path / "out")
    assert not (tmp_path / "out").exists()


# --- (12b) no leftovers ------------------------------------------------------------------------
def test_refused_remote_archive_leaves_cache_and_destination_as_they_were(http_server, tmp_path, monkeypatch):
    monkeypatch.setenv(C.ENV_HOME, str(tmp_path / "home"))
    _tar(http_server.root / "model.tar.gz", [_member("config.json", "file", "{}"), _member("x", "sym", "/etc/passwd")])
    url = f"{http_server.url}/model.tar.gz"
    good = pack_tar(make_tree(tmp_path / "m", {"a.txt": b"a"}), http_server.root / "good.tar.gz")
    fetch(f"{http_server.url}/{good.name}")  # another entry in the cache, which must stay
    cache = tmp_path / "home" / C.CACHE_DIR
    before = _snapshot(cache)
    for _ in range(2):
        with pytest.raises(UnsafeArchive):
            fetch(url)
        assert _snapshot(cache) == before
    dest = make_tree(tmp_path / "dest", {"mine.txt": b"mine"})
    with pytest.raises(UnsafeArchive):
        fetch(url, dest)
    assert _snapshot(dest) == {"mine.txt": b"mine".hex()}
    with pytest.raises(UnsafeArchive):
        fetch(url, tmp_path / "new" / "dest")
    assert not (tmp_path / "new").exists()


def test_tar_long_name_header_is_not_read_whole(tmp_path):
    """tarfile would read a GNU long-name (or pax) header of any size into memory: a 64 MB one is refused first."""
    header = tarfile.TarInfo("././@LongLink")
    header.type = tarfile.GNUTYPE_LONGNAME
    header.size = 64 << 20
    with gzip.open(tmp_path / "longname.tar.gz", "wb", compresslevel=1) as f:
        f.write(header.tobuf(format=tarfile.GNU_FORMAT))
        for _ in range(64):
            f.write(b"a" * (1 << 20))
    tracemalloc.start()
    try:
        with pytest.raises(UnsafeArchive, match=f"header of {64 << 20} bytes"):
            unpack(tmp_path / "longname.tar.gz", tmp_path / "out")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20 and not (tmp_path / "out").exists()
