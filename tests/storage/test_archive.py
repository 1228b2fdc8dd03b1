"""Safe unpacking: malicious archives are refused with a clear message and nothing escapes the folder."""

from __future__ import annotations

import io
import os
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest
from kt_storage_util import make_tree, read_tree

from kubetune import constants as C
from kubetune.errors import SourceError
from kubetune.storage import fetch, push
from kubetune.storage.archive import UnsafeArchive, pack_tar, unpack


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tf:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
            else:
                tf.addfile(info)
    return path


def _info(name: str, type_: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = type_
    info.linkname = linkname
    info.mode = 0o644
    return info


def test_good_tar_and_zip(tmp_path):
    files = {"config.json": b"{}", "sub/weights.bin": os.urandom(3000)}
    src = make_tree(tmp_path / "src", files)
    assert read_tree(unpack(pack_tar(src, tmp_path / "m.tar.gz"), tmp_path / "out")) == files

    with zipfile.ZipFile(tmp_path / "m.zip", "w") as zf:
        for rel, data in files.items():
            zf.writestr(rel, data)
    assert read_tree(unpack(tmp_path / "m.zip", tmp_path / "zout")) == files

    inner_link = _tar(tmp_path / "l.tar", [(_info("a.txt"), b"A"), (_info("sub/link", tarfile.SYMTYPE, "../a.txt"), None)], "w")
    out = unpack(inner_link, tmp_path / "lout")
    assert (out / "sub" / "link").read_bytes() == b"A"  # a link that stays inside is fine


@pytest.mark.parametrize(
    "members, why",
    [
        ([(_info("/etc/kubetune-evil"), b"x")], "absolute path"),
        ([(_info("../evil.txt"), b"x")], "contains '..'"),
        ([(_info("ok/../../evil.txt"), b"x")], "contains '..'"),
        ([(_info("link", tarfile.SYMTYPE, "/etc/passwd"), None)], "link to an absolute path"),
        ([(_info("link", tarfile.SYMTYPE, "../../outside"), None)], "leaves the destination folder"),
        ([(_info("d", tarfile.SYMTYPE, "."), None), (_info("d/d2", tarfile.SYMTYPE, ".."), None)], "leaves the destination"),
        ([(_info("hard", tarfile.LNKTYPE, "../../etc/passwd"), None)], "leaves the destination folder"),
        ([(_info("dev", tarfile.CHRTYPE), None)], "device file"),
        ([(_info("blk", tarfile.BLKTYPE), None)], "device file"),
        ([(_info("fifo", tarfile.FIFOTYPE), None)], "FIFO"),
    ],
    ids=["absolute", "dotdot", "nested-dotdot", "abs-symlink", "escaping-symlink", "link-chain", "hardlink",
         "chardev", "blockdev", "fifo"],
)
def test_malicious_tar_refused(tmp_path, members, why):
    arc = _tar(tmp_path / "evil.tar.gz", members)
    dest = tmp_path / "box" / "out"
    with pytest.raises(UnsafeArchive) as e:
        unpack(arc, dest, label="s3://bucket/evil.tar.gz")
    msg = str(e.value)
    assert msg.startswith("s3://bucket/evil.tar.gz: refusing to unpack: member")
    assert why in msg and "hint:" in msg
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "box" / "evil.txt").exists()


def test_write_through_earlier_symlink_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    # "a" -> "." is harmless, but a link to a sibling folder outside must never be written through
    arc = _tar(tmp_path / "e.tar", [(_info("a", tarfile.SYMTYPE, "../outside"), None), (_info("a/pwned"), b"x")], "w")
    with pytest.raises(UnsafeArchive):
        unpack(arc, tmp_path / "out")
    assert not (outside / "pwned").exists()


def test_zip_slip_and_zip_symlink(tmp_path):
    with zipfile.ZipFile(tmp_path / "slip.zip", "w") as zf:
        zf.writestr("../../evil.txt", b"x")
    with pytest.raises(UnsafeArchive, match="contains '..'"):
        unpack(tmp_path / "slip.zip", tmp_path / "out")

    with zipfile.ZipFile(tmp_path / "link.zip", "w") as zf:
        info = zipfile.ZipInfo("link")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(info, "/etc/passwd")
    with pytest.raises(UnsafeArchive, match="absolute path"):
        unpack(tmp_path / "link.zip", tmp_path / "out2")


def test_size_and_count_limits(tmp_path, monkeypatch):
    # a zip bomb in miniature: 5 MB of zeros compress to a few kB
    with zipfile.ZipFile(tmp_path / "bomb.zip", "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("zeros.bin", b"\0" * 5_000_000)
    assert (tmp_path / "bomb.zip").stat().st_size < 50_000
    monkeypatch.setenv(C.ENV_MAX_UNPACK_BYTES, "1000000")
    with pytest.raises(UnsafeArchive, match=f"limit of 1000000 bytes.*{C.ENV_MAX_UNPACK_BYTES}"):
        unpack(tmp_path / "bomb.zip", tmp_path / "out")
    monkeypatch.delenv(C.ENV_MAX_UNPACK_BYTES)

    many = _tar(tmp_path / "many.tar", [(_info(f"f{i}"), b"") for i in range(20)], "w")
    monkeypatch.setenv(C.ENV_MAX_UNPACK_FILES, "10")
    with pytest.raises(UnsafeArchive, match="limit of 10 members"):
        unpack(many, tmp_path / "out2")


def test_not_an_archive(tmp_path):
    (tmp_path / "fake.tar.gz").write_bytes(b"this is not gzip at all")
    with pytest.raises(SourceError, match="not a readable tar archive"):
        unpack(tmp_path / "fake.tar.gz", tmp_path / "out")


def test_malicious_archive_through_fetch(http_server, tmp_path):
    _tar(http_server.root / "model.tar.gz", [(_info("config.json"), b"{}"), (_info("../../escape.txt"), b"x")])
    url = f"{http_server.url}/model.tar.gz"
    with pytest.raises(UnsafeArchive) as e:
        fetch(url, tmp_path / "dest")
    assert url in str(e.value) and "../../escape.txt" in str(e.value)
    assert not (tmp_path / "escape.txt").exists()
    with pytest.raises(UnsafeArchive):
        fetch(url)  # through the cache too; nothing is committed
    with pytest.raises(UnsafeArchive):
        fetch(url)


def test_local_archive_unpacked_into_cache_once(tmp_path):
    files = {"a.txt": b"a", "b/c.txt": b"c"}
    arc = pack_tar(make_tree(tmp_path / "m", files), tmp_path / "m.tar.gz")
    from kubetune.storage.fetcher import fetch_with_stats

    p1, s1 = fetch_with_stats(arc)
    p2, s2 = fetch_with_stats(str(arc))
    assert read_tree(p1) == files and p1 == p2 and s2.cached and not s1.cached


def test_push_tar_round_trip_file_uri(tmp_path):
    files = {"config.json": b"{}", "w/x.bin": os.urandom(100)}
    src = make_tree(tmp_path / "model", files)
    summary = push(src, f"file://{tmp_path}/store/model.tar.gz", tar=True)
    assert summary["files"] == 1 and (tmp_path / "store" / "model.tar.gz").is_file()
    assert read_tree(fetch(f"file://{tmp_path}/store/model.tar.gz", tmp_path / "out")) == files


def test_fetch_reports_what_an_archive_unpacked(http_server, tmp_path):
    """`kubetune fetch ARCHIVE DEST` says what the archive put in DEST (it used to say "0 B in 0 file(s), nothing
    to transfer" for a local one); a downloaded one says both what moved and what it unpacked."""
    import typer
    from typer.testing import CliRunner

    from kubetune.cli.storage import register

    app = typer.Typer()
    register(app)
    files = {f"f{i}.txt": f"file {i}\n".encode() for i in range(1, 7)}
    arc = pack_tar(make_tree(tmp_path / "m", files), tmp_path / "m.tar.gz")
    r = CliRunner().invoke(app, ["fetch", str(arc), str(tmp_path / "local"), "-q"])
    assert r.exit_code == 0, r.output
    assert read_tree(tmp_path / "local") == files
    assert f"fetched {arc} -> {tmp_path / 'local'}: unpacked 6 file(s), 42 B, " in r.stderr, r.stderr
    assert "nothing to transfer" not in r.stderr and "0 file(s)" not in r.stderr, r.stderr

    (http_server.root / "m.tar.gz").write_bytes(arc.read_bytes())
    r = CliRunner().invoke(app, ["fetch", f"{http_server.url}/m.tar.gz", str(tmp_path / "remote"), "-q"])
    assert r.exit_code == 0, r.output
    assert f"{arc.stat().st_size} B in 1 file(s), unpacked 6 file(s), 42 B, " in r.stderr, r.stderr
