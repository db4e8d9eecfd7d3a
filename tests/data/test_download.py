"""`deepinit data download`: every check runs against a local HTTP server on 127.0.0.1 serving
generated files (the internet is never touched): full download, resume with a Range request
after a cut connection, SHA-256 mismatch, 404, an unreachable host, unsafe archives, and
`data prepare` downloading when --raw is not given."""
import gzip
import json
import os
import re
import socket
import zipfile
from pathlib import Path

import pytest

import runner.data.download as dl
from runner.cli import main as deepinit_main
from runner.cli.data import main as main_data
from runner.data.corpus import read_lines
from runner.data.download import DownloadError, RemoteCorpus, RemoteFile, download, fetch_file, safe_unpack
from runner.data.prepare import prepare_iwslt14
from tests.conftest import run_cli
from tests.data.http_files import FileServer, sha256
from tests.data.http_files import tgz as _tgz


@pytest.fixture
def server():
    s = FileServer()
    yield s
    s.close()


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """Data root in tmp_path; no mirror from the environment."""
    monkeypatch.setenv("DEEPINIT_DATA_ROOT", str(tmp_path / "root"))
    monkeypatch.delenv(dl.MIRROR_ENV, raising=False)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- fetching ------------------------------------------------------------------------------


def test_full_download_records_the_hash_and_keeps_the_file(server, tmp_path):
    data = os.urandom(100_000)
    server.files["/de-en.tgz"] = data
    folder = tmp_path / "dl"
    result = download("iwslt14", folder, mirror=server.url + "/", progress=lambda m: None)
    (record,) = result["files"]
    assert (folder / "de-en.tgz").read_bytes() == data
    assert record == {"file": "de-en.tgz", "url": server.url + "/de-en.tgz", "sha256": sha256(data),
                      "verified": False, "bytes": len(data)}
    assert leftovers(folder) == ["de-en.tgz", "downloads.json"]  # no .part, no temporary file
    manifest = json.loads((folder / "downloads.json").read_text())
    assert manifest["de-en.tgz"]["sha256"] == sha256(data)
    # A second run finds the file in place: no request, same record (URL kept from the manifest).
    server.log.clear()
    again = download("iwslt14", folder, mirror=server.url, progress=lambda m: None)
    assert server.log == [] and again["files"] == [record]


def test_known_hash_is_checked_and_default_folder_is_under_the_data_root(server, tmp_path):
    data = b"hello\n" * 1000
    server.files["/a.txt"] = data
    record = fetch_file(RemoteFile("a.txt", (server.url + "/a.txt",), sha256(data)), dl.download_dir("x"))
    assert record["verified"] and record["sha256"] == sha256(data)
    assert (tmp_path / "root" / "downloads" / "x" / "a.txt").read_bytes() == data


def test_mirror_falls_back_to_the_next_url_and_env_var_overrides(server, tmp_path, monkeypatch):
    data = b"x" * 5000
    server.files["/good/f.bin"] = data
    remote = RemoteFile("f.bin", (server.url + "/moved/f.bin", server.url + "/good/f.bin"), sha256(data))
    assert fetch_file(remote, tmp_path / "a")["url"] == server.url + "/good/f.bin"
    monkeypatch.setenv(dl.MIRROR_ENV, server.url + "/good")
    assert dl.mirror_urls(remote, None) == (server.url + "/good/f.bin",)
    assert fetch_file(RemoteFile("f.bin", ("http://example.invalid/f.bin",), sha256(data)),
                      tmp_path / "b")["url"] == server.url + "/good/f.bin"


def test_cut_connection_resumes_with_a_range_request(server, tmp_path):
    data = os.urandom(300_000)
    server.files["/big.bin"] = data
    server.cut_once.add("/big.bin")
    remote = RemoteFile("big.bin", (server.url + "/big.bin",), sha256(data))
    folder = tmp_path / "dl"
    with pytest.raises(DownloadError, match=r"connection closed after \d+ of 300000 bytes; run again to resume"):
        fetch_file(remote, folder)
    part = folder / ".big.bin.part"
    have = part.stat().st_size
    assert 0 < have < len(data) and not (folder / "big.bin").exists()
    record = fetch_file(remote, folder)
    assert (folder / "big.bin").read_bytes() == data and record["verified"]
    assert server.log[-1] == ("/big.bin", f"bytes={have}-")  # only the rest was asked for
    assert leftovers(folder) == ["big.bin", "downloads.json"]


def test_checksum_mismatch_keeps_nothing(server, tmp_path):
    server.files["/train.de.gz"] = gzip.compress(b"not the real file\n")
    folder = tmp_path / "dl"
    with pytest.raises(DownloadError) as e:
        download("multi30k", folder, mirror=server.url, progress=lambda m: None)
    msg = str(e.value)
    assert "\n" not in msg and "SHA-256 is not the known" in msg and server.url + "/train.de.gz" in msg
    assert leftovers(folder) == []  # not the file, not a .part, not a temporary file


def test_404_names_the_url_and_the_manual_way(server, tmp_path):
    with pytest.raises(DownloadError) as e:
        download("iwslt14", tmp_path / "dl", mirror=server.url, progress=lambda m: None)
    msg = str(e.value)
    assert f"{server.url}/de-en.tgz (HTTP 404 Not Found)" in msg and "--raw PATH" in msg
    assert leftovers(tmp_path / "dl") == []


def test_unreachable_host_is_one_line_with_exit_code_2(tmp_path, capsys):
    url = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(SystemExit) as e:
        deepinit_main(["data", "download", "multi30k", "--mirror", url, "--no-progress"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert f"{url}/train.de.gz (connection refused)" in err and "--raw PATH" in err


def test_unreachable_host_via_the_command(tmp_path):
    url = f"http://127.0.0.1:{closed_port()}"
    env = {**os.environ, "DEEPINIT_DATA_ROOT": str(tmp_path / "root"), dl.MIRROR_ENV: url}
    proc = run_cli(["data", "download", "iwslt14"], cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("deepinit: error: iwslt14: could not download de-en.tgz")
    assert f"{url}/de-en.tgz" in lines[0] and "--raw PATH" in lines[0]


# ---- unpacking -----------------------------------------------------------------------------


@pytest.mark.parametrize("archive", [
    {"members": {"ok.txt": b"ok", "../evil.txt": b"evil"}},
    {"members": {"ok.txt": b"ok", "/tmp/evil-abs.txt": b"evil"}},
    {"members": {"ok.txt": b"ok"}, "symlinks": {"link": "../../evil-dir"}},
    {"members": {"ok.txt": b"ok"}, "symlinks": {"sub/link": "/etc"}},
], ids=["dotdot", "absolute", "symlink-up", "symlink-absolute"])
def test_unsafe_tar_is_rejected_and_nothing_is_written(tmp_path, archive):
    path = tmp_path / "a" / "bad.tgz"
    path.parent.mkdir()
    path.write_bytes(_tgz(archive["members"], archive.get("symlinks", {})))
    with pytest.raises(DownloadError, match="unsafe archive"):
        safe_unpack(path, tmp_path / "a" / "out")
    assert leftovers(tmp_path / "a") == ["bad.tgz"]
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "evil-dir").exists()


def test_unsafe_zip_is_rejected(tmp_path):
    path = tmp_path / "bad.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("ok.txt", "ok")
        zf.writestr("../evil.txt", "evil")
    with pytest.raises(DownloadError, match="unsafe archive"):
        safe_unpack(path, tmp_path / "out")
    assert leftovers(tmp_path) == ["bad.zip"]


def test_download_unpacks_a_safe_archive_and_refuses_a_crafted_one(server, tmp_path):
    server.files["/dev.tgz"] = _tgz({"dev/newstest2013.de": b"Hallo\n", "dev/newstest2013.en": b"Hello\n"},
                                    {"dev/latest.de": "newstest2013.de"})
    folder = tmp_path / "dl"
    result = download("wmt14-en-de", folder, mirror=server.url, progress=lambda m: None,
                      files=[RemoteFile("dev.tgz", (), None, unpack=True)])
    assert result["files"][0]["unpacked"] == "dev"
    assert (folder / "dev" / "dev" / "newstest2013.en").read_text() == "Hello\n"
    assert (folder / "dev" / "dev" / "latest.de").read_text() == "Hallo\n"  # a link inside is fine
    server.files["/test-full.tgz"] = _tgz({"test-full/a.sgm": b"x", "../../escaped.txt": b"evil"})
    with pytest.raises(DownloadError, match="unsafe archive.*escaped"):
        download("wmt14-en-de", folder, mirror=server.url, progress=lambda m: None,
                 files=[RemoteFile("test-full.tgz", (), None, unpack=True)])
    assert not (folder / "test-full").exists()
    assert not any(p.name == "escaped.txt" for p in tmp_path.rglob("*"))


def test_iwslt14_prepare_refuses_a_crafted_archive(tmp_path):
    path = tmp_path / "de-en.tgz"
    path.write_bytes(_tgz({"de-en/train.tags.de-en.de": b"x\n", "../de-en/train.tags.de-en.en": b"y\n"}))
    with pytest.raises(DownloadError, match="unsafe archive"):
        prepare_iwslt14(path, tmp_path / "out", progress=lambda m: None)


# ---- prepare without --raw -----------------------------------------------------------------


def test_prepare_multi30k_without_raw_downloads_first(server, tmp_path, monkeypatch, capsys):
    lines = {"de": "Ein Hund läuft.", "en": "A dog's run."}
    files = []
    for split in ("train", "val", "test_2016_flickr"):
        for lang, line in lines.items():
            data = gzip.compress((line + "\n").encode())
            server.files[f"/{split}.{lang}.gz"] = data
            files.append(RemoteFile(f"{split}.{lang}.gz", ("http://example.invalid/",), sha256(data)))
    small = RemoteCorpus("multi30k", tuple(files), about="test", manual="pass --raw PATH")
    monkeypatch.setitem(dl.CORPORA, "multi30k", small)
    out = tmp_path / "m"
    assert main_data(["prepare", "multi30k", "--mirror", server.url, "--out", str(out), "--no-progress"]) == 0
    assert read_lines(out / "test.en") == ["a dog &apos;s run ."]
    prep = json.loads((out / "prepare.json").read_text())
    assert prep["raw"] == str(tmp_path / "root" / "downloads" / "multi30k")
    by_name = {r["file"]: r for r in prep["downloads"]}
    assert by_name["val.en.gz"]["sha256"] == sha256(server.files["/val.en.gz"])
    assert all(r["verified"] for r in prep["downloads"])
    capsys.readouterr()  # wmt14-en-de is prepared too, so it downloads first (here: nothing answers)
    url = f"http://127.0.0.1:{closed_port()}"
    assert main_data(["prepare", "wmt14-en-de", "--mirror", url, "--out", str(tmp_path / "w"),
                      "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "could not download training-parallel-europarl-v7.tgz" in err
    assert f"{url}/training-parallel-europarl-v7.tgz (connection refused)" in err


def _iwslt_tgz() -> bytes:
    members = {}
    for lang, words in (("de", "Satz Nummer {} ist hier ."), ("en", "Sentence number {} is here .")):
        members[f"de-en/train.tags.de-en.{lang}"] = "".join(
            words.format(i) + "\n" for i in range(30)).encode()
        for name in ("IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010",
                     "IWSLT14.TED.tst2011", "IWSLT14.TED.tst2012"):
            members[f"de-en/{name}.de-en.{lang}.xml"] = \
                f'<doc>\n<seg id="1">{words.format(name)}</seg>\n</doc>\n'.encode()
    return _tgz(members)


def test_prepare_iwslt14_without_raw_records_the_unknown_hash(server, tmp_path):
    server.files["/de-en.tgz"] = data = _iwslt_tgz()
    out = tmp_path / "i"
    assert main_data(["prepare", "iwslt14", "--mirror", server.url, "--out", str(out),
                      "--bpe-merges", "20", "--no-progress"]) == 0
    prep = json.loads((out / "prepare.json").read_text())
    assert prep["downloads"] == [{"file": "de-en.tgz", "url": server.url + "/de-en.tgz",
                                  "sha256": sha256(data), "verified": False, "bytes": len(data)}]
    assert prep["test"] == 5


def test_help_lists_the_corpora(capsys):
    assert main_data(["--help"]) == 0
    out = capsys.readouterr().out
    assert "download NAME" in out and "prepare NAME" in out
    assert all(name in out for name in ("multi30k", "iwslt14", "wmt14-en-de"))
    assert main_data(["download", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--mirror URL" in out and "wmt14-en-de" in out and "DATA_ROOT/downloads/NAME" in out
    # one column of names, the longest included, then the descriptions in one column
    rows = [line for line in out.splitlines()[out.splitlines().index("corpora:") + 1:] if line.strip()]
    assert {re.match(r"  \S+\s+", line).end() for line in rows} == {len("  tinyshakespeare  ")}
