"""`deepinit data download NAME`: the raw files of a corpus, fetched into the per-user cache.

Files go to DATA_ROOT/downloads/NAME/ (DATA_ROOT as in runner/data/corpus.py: $DEEPINIT_DATA_ROOT,
else $XDG_CACHE_HOME/deepinit/data). Each file is fetched with pooch: from its upstream URL first,
then from the mirrors listed with it; its SHA-256 is checked where we know it, and recorded in
NAME/downloads.json (and by `deepinit data prepare` in prepare.json) either way. pooch streams into
a temporary file in the same folder and renames it into place only after the hash check, so a
file in the folder is always complete. Archives that are unpacked (WMT'14) are checked first:
no absolute names, no `..`, no links leading out, no device files; then unpacked into a
temporary folder that is renamed into place.

Where nothing can be fetched the error is one line that names the URLs tried and the manual way
(fetch the file yourself and pass `--raw PATH`, or put it into the folder).
"""
from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import posixpath
import shutil
import tarfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import pooch
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from runner.data.corpus import CorpusError, default_data_root
from runner.data.lm import SHAKESPEARE_SHA256
from runner.files import atomic_write_text

DOWNLOADS_FOLDER = "downloads"  # DATA_ROOT/downloads/NAME
MIRROR_ENV = "DEEPINIT_DOWNLOAD_MIRROR"  # a base URL that replaces the known ones (FILE from BASE/FILE)
MANIFEST = "downloads.json"
TIMEOUT_S = 60.0


class DownloadError(CorpusError):
    """A file that could not be fetched or unpacked; the message is one line and says what to do."""


@dataclass(frozen=True)
class RemoteFile:
    name: str                 # the file name in the download folder
    urls: tuple[str, ...]     # upstream first, then mirrors
    sha256: str | None = None  # None: not known, the hash is recorded instead
    unpack: bool = False      # unpack the archive into FOLDER/<name without .tgz>/


@dataclass(frozen=True)
class RemoteCorpus:
    name: str
    files: tuple[RemoteFile, ...]
    about: str     # one line for --help
    manual: str    # the manual alternative, for the error line ({folder}: the download folder)


# --------------------------------------------------------------------------------------------
# The corpora

# Multi30k Task 1 (multi30k/dataset): data/task1/raw/*.gz at master, and the same files at the last
# commit that changed them (byte-identical to master when this list was written).
MULTI30K_URL = "https://github.com/multi30k/dataset (data/task1/raw/*.gz)"
MULTI30K_COMMIT = "c40b37b23d6387214f8ab37335b5a8672b9745f2"
_MULTI30K_RAW = "https://raw.githubusercontent.com/multi30k/dataset/{ref}/data/task1/raw/{name}"
MULTI30K_SHA256 = {
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2017_flickr.de.gz": "a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee",
    "test_2017_flickr.en.gz": "76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074",
    "test_2017_mscoco.de.gz": "799e4854c25d601cb6cb6be29eabe5667734c61ace2f495e03e429031a0bc338",
    "test_2017_mscoco.en.gz": "aab300bfb4427697987e02cd0aacd44bfe8aa50456231b6474c08038bbed2b58",
    "test_2018_flickr.de.gz": "ddd0130c7d97482dc5197a02141dae8dd79f20f03586c480d675c09a32daf608",
    "test_2018_flickr.en.gz": "ef4f4844037d4c5dea75c9a8ed5fd78905967a26f67c255e230cc9780032654d",
}

# IWSLT'14 de-en (WIT3 2014-01), the archive fairseq's prepare-iwslt14.sh downloads. WIT3 moved
# its archive, so fairseq's copy comes first. No published SHA-256: the hash is recorded.
IWSLT14_URL = "http://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz"  # fairseq's mirror
IWSLT14_ORIGINAL_URL = "https://wit3.fbk.eu/archive/2014-01/texts/de/en/de-en.tgz"  # WIT3 2014-01
IWSLT14_URLS = ("https://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz", IWSLT14_URL,
                IWSLT14_ORIGINAL_URL)

# WMT'14 en-de as fairseq's examples/translation/prepare-wmt14en2de.sh fetches it, default file list
# (news-commentary v12 from WMT'17; the script's --icml17 variant with v9 is not offered). The
# script's http://statmt.org URLs come after their https://www.statmt.org homes. SHA-256 as
# recorded by independent hash-checked fetchers of the same URLs; test-full.tgz: not known.
_STATMT = "https://www.statmt.org/"
_STATMT_DATA = "https://data.statmt.org/wmt17/translation-task/"
WMT14_FILES = (
    RemoteFile("training-parallel-europarl-v7.tgz",
               (_STATMT + "wmt13/training-parallel-europarl-v7.tgz",
                "http://statmt.org/wmt13/training-parallel-europarl-v7.tgz"),
               "0224c7c710c8a063dfd893b0cc0830202d61f4c75c17eb8e31836103d27d96e7", unpack=True),
    RemoteFile("training-parallel-commoncrawl.tgz",
               (_STATMT + "wmt13/training-parallel-commoncrawl.tgz",
                "http://statmt.org/wmt13/training-parallel-commoncrawl.tgz"),
               "c7a74e2ea01ac6c920123108627e35278d4ccb5701e15428ffa34de86fa3a9e5", unpack=True),
    RemoteFile("training-parallel-nc-v12.tgz",
               (_STATMT_DATA + "training-parallel-nc-v12.tgz",
                "http://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz"),
               "2b45f30ef1d550d302fd17dd3a5cbe19134ccc4c2cf50c2dae534aee600101a2", unpack=True),
    RemoteFile("dev.tgz",
               (_STATMT_DATA + "dev.tgz", "http://data.statmt.org/wmt17/translation-task/dev.tgz"),
               "9d5ff04a28496b7796904ea65e50e3837bab14dbdca88b1e063105f17513dca9", unpack=True),
    RemoteFile("test-full.tgz",
               (_STATMT + "wmt14/test-full.tgz", "http://statmt.org/wmt14/test-full.tgz"),
               None, unpack=True),
)

# karpathy/char-rnn data/tinyshakespeare/input.txt, the file nanoGPT's
# data/shakespeare_char/prepare.py fetches; data=shakespeare_char checks the same hash
TINYSHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
TINYSHAKESPEARE_SHA256 = SHAKESPEARE_SHA256

CORPORA: dict[str, RemoteCorpus] = {
    "multi30k": RemoteCorpus(
        "multi30k",
        tuple(RemoteFile(name, (_MULTI30K_RAW.format(ref="master", name=name),
                                _MULTI30K_RAW.format(ref=MULTI30K_COMMIT, name=name)), sha)
              for name, sha in MULTI30K_SHA256.items()),
        about="Multi30k Task 1 raw de/en files (12 .gz files, 1.4 MB, SHA-256 checked)",
        manual="fetch data/task1/raw/*.gz from github.com/multi30k/dataset yourself and pass "
               "--raw PATH to `deepinit data prepare multi30k`"),
    "iwslt14": RemoteCorpus(
        "iwslt14", (RemoteFile("de-en.tgz", IWSLT14_URLS),),
        about="IWSLT'14 de-en.tgz (WIT3 2014-01, via fairseq's mirror; hash recorded)",
        manual="fetch de-en.tgz yourself and pass --raw PATH/de-en.tgz to "
               "`deepinit data prepare iwslt14`"),
    "tinyshakespeare": RemoteCorpus(
        "tinyshakespeare",
        (RemoteFile("input.txt", (TINYSHAKESPEARE_URL,), TINYSHAKESPEARE_SHA256),),
        about="tinyshakespeare input.txt for data=shakespeare_char (1.1 MB, SHA-256 checked)",
        manual="fetch data/tinyshakespeare/input.txt from github.com/karpathy/char-rnn yourself "
               "into {folder}, or set data.dir to the folder holding it"),
    "wmt14-en-de": RemoteCorpus(
        "wmt14-en-de", WMT14_FILES,
        about="WMT'14 en-de archives of fairseq's prepare-wmt14en2de.sh (several GB), unpacked",
        manual="fetch it yourself into {folder} (same file name) and run the command again"),
}


def download_dir(name: str) -> Path:
    """DATA_ROOT/downloads/NAME, read from the environment at each call."""
    return default_data_root() / DOWNLOADS_FOLDER / name


# --------------------------------------------------------------------------------------------
# Fetching one file


class FetchFailed(Exception):
    """One URL did not deliver the file; `reason` is a few words."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _reason(e: BaseException) -> str:
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code} {e.reason}"
    if isinstance(e, urllib.error.URLError):
        e = e.reason if isinstance(e.reason, BaseException) else OSError(str(e.reason))
    if isinstance(e, OSError) and e.strerror:
        return e.strerror.lower()
    return (str(e) or type(e).__name__).replace("\n", " ")


class ResumingDownloader:
    """A pooch downloader that resumes a cut download.

    pooch's own HTTPDownloader starts again from byte 0 every time (it streams into a fresh
    temporary file). This one keeps what has arrived in FOLDER/.NAME.part (and the URL and
    validator it came from in .NAME.part.json) and asks for the rest with a `Range` header; with
    `If-Range` a file that changed upstream comes whole. When the body is complete it moves the
    .part file to pooch's temporary file, which pooch hash-checks and renames into place."""

    def __init__(self, part: Path, progressbar: bool = False, timeout: float = TIMEOUT_S,
                 chunk_size: int = 1 << 16):
        self.part, self.progressbar, self.timeout, self.chunk_size = part, progressbar, timeout, chunk_size
        self.meta = part.with_name(part.name + ".json")
        self.called = False  # pooch calls us only when the file is missing or its hash is wrong

    def _resume_state(self, url: str) -> tuple[int, str | None]:
        """(bytes already here, validator) for a .part file fetched from this same URL."""
        try:
            meta = json.loads(self.meta.read_text(encoding="utf-8"))
            if meta.get("url") == url and self.part.is_file():
                return self.part.stat().st_size, meta.get("validator")
        except (OSError, ValueError):
            pass
        self._forget()
        return 0, None

    def _forget(self) -> None:
        for p in (self.part, self.meta):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()

    def __call__(self, url: str, output_file, pooch_obj=None, check_only: bool = False):
        self.called = True
        headers = {"User-Agent": f"deepinit (pooch {pooch.__version__})"}
        if check_only:  # pooch's availability check: is the URL there?
            try:
                with urllib.request.urlopen(urllib.request.Request(url, headers=headers, method="HEAD"),
                                            timeout=self.timeout):
                    return True
            except (urllib.error.URLError, OSError):
                return False
        offset, validator = self._resume_state(url)
        request = urllib.request.Request(url, headers=headers)
        if offset:
            request.add_header("Range", f"bytes={offset}-")
            if validator:
                request.add_header("If-Range", validator)
        try:
            response = urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            if e.code == 416 and offset:  # nothing left to fetch (or a stale .part): start over
                self._forget()
                raise FetchFailed("the partial download did not fit the file; run again") from None
            raise FetchFailed(_reason(e)) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            raise FetchFailed(_reason(e)) from None
        with response:
            status = getattr(response, "status", None)  # None for file:// URLs
            resumed = offset > 0 and status == 206
            if status == 206 and not (resumed and response.headers.get("Content-Range", "")
                                      .startswith(f"bytes {offset}-")):
                self._forget()
                raise FetchFailed("the server sent a range that was not asked for; run again")
            if not resumed:  # 200: the whole file (no range support, or it changed upstream)
                offset = 0
            length = response.headers.get("Content-Length")
            total = offset + int(length) if length and length.isdigit() else None
            validator = response.headers.get("ETag") or response.headers.get("Last-Modified")
            self.part.parent.mkdir(parents=True, exist_ok=True)
            self.meta.write_text(json.dumps({"url": url, "validator": validator}), encoding="utf-8")
            done = offset
            with open(self.part, "ab" if resumed else "wb") as f, _progress(self.progressbar) as bar:
                task = bar.add_task(self.part.name[1:-len(".part")], total=total, completed=done)
                try:
                    while chunk := response.read(self.chunk_size):
                        f.write(chunk)
                        done += len(chunk)
                        bar.update(task, completed=done)
                except (OSError, http.client.HTTPException) as e:
                    raise FetchFailed(f"connection lost after {done} bytes ({_reason(e)}); "
                                      "run again to resume") from None
        if total is not None and done != total:
            raise FetchFailed(f"connection closed after {done} of {total} bytes; run again to resume")
        if hasattr(output_file, "write"):
            with open(self.part, "rb") as f:
                shutil.copyfileobj(f, output_file)
            self._forget()
        else:
            os.replace(self.part, output_file)
            self.meta.unlink()
        return None


def _progress(enabled: bool) -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(),
                    TransferSpeedColumn(), TimeRemainingColumn(), console=Console(stderr=True),
                    disable=not enabled, transient=True)


@contextlib.contextmanager
def _quiet_pooch() -> Iterator[None]:
    """pooch logs every download at INFO; we say it ourselves (and draw a bar)."""
    logger = pooch.get_logger()
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def mirror_urls(remote: RemoteFile, mirror: str | None) -> tuple[str, ...]:
    """The URLs to try for `remote`: MIRROR/NAME alone when a mirror base is given (argument, else
    $DEEPINIT_DOWNLOAD_MIRROR), else the known ones."""
    mirror = mirror or os.environ.get(MIRROR_ENV) or None
    if mirror:
        return (mirror.rstrip("/") + "/" + remote.name,)
    return remote.urls


def _read_manifest(folder: Path) -> dict:
    try:
        data = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_manifest(folder: Path, manifest: dict) -> None:
    atomic_write_text(folder / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def fetch_file(remote: RemoteFile, folder: str | os.PathLike, mirror: str | None = None,
               progressbar: bool = False, manual: str = "fetch it yourself",
               corpus: str | None = None) -> dict:
    """FOLDER/NAME, fetched unless it is already there (and matches the known hash). Returns the
    record kept in FOLDER/downloads.json: file, url, sha256, verified (the known hash matched),
    bytes. DownloadError (one line) when no URL delivers it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    urls = mirror_urls(remote, mirror)
    if not urls:
        raise DownloadError(f"{remote.name}: no URL to fetch it from; pass a mirror ({MIRROR_ENV})")
    target = folder / remote.name
    manifest = _read_manifest(folder)
    known = f"sha256:{remote.sha256}" if remote.sha256 else None
    errors = []
    for url in urls:
        downloader = ResumingDownloader(folder / f".{remote.name}.part", progressbar=progressbar)
        try:
            with _quiet_pooch():
                pooch.retrieve(url, known_hash=known, fname=remote.name, path=folder,
                               downloader=downloader)
        except FetchFailed as e:
            errors.append(f"{url} ({e.reason})")
            continue
        except ValueError:  # pooch's hash check: the temporary file is already deleted
            errors.append(f"{url} (SHA-256 is not the known {remote.sha256}; the file was discarded)")
            continue
        old = {} if downloader.called else manifest.get(remote.name, {})
        stat = target.stat()
        same = old.get("bytes") == stat.st_size and old.get("mtime_ns") == stat.st_mtime_ns
        sha = remote.sha256 or (old["sha256"] if same and old.get("sha256") else pooch.file_hash(str(target)))
        # A file found in the folder keeps the URL it came from (when we fetched it).
        source = url if downloader.called else old.get("url")
        record = {"file": remote.name, **({"url": source} if source else {}), "sha256": sha,
                  "verified": remote.sha256 is not None, "bytes": stat.st_size,
                  "mtime_ns": stat.st_mtime_ns}
        manifest[remote.name] = record
        _write_manifest(folder, manifest)
        return {k: v for k, v in record.items() if k != "mtime_ns"}
    who = f"{corpus}: " if corpus else ""
    raise DownloadError(f"{who}could not download {remote.name}: tried " + "; ".join(errors)
                        + f". Check the network (or set {MIRROR_ENV}), or {manual.format(folder=folder)}")


# --------------------------------------------------------------------------------------------
# Unpacking archives safely


def _escapes(path: str) -> bool:
    """True for an archive name that is absolute or climbs out with `..` (either slash)."""
    p = path.replace("\\", "/")
    return p.startswith("/") or (len(p) > 1 and p[1] == ":") or ".." in p.split("/")


def _link_escapes(member_dir: str, target: str) -> bool:
    t = target.replace("\\", "/")
    if t.startswith("/") or (len(t) > 1 and t[1] == ":"):
        return True
    joined = posixpath.normpath(posixpath.join(member_dir, t))
    return joined == ".." or joined.startswith("../")


def check_tar_members(tar: tarfile.TarFile, archive: str | os.PathLike) -> list[tarfile.TarInfo]:
    """Every member of `tar`, or DownloadError when one would land outside the target folder:
    an absolute name, a `..` component, a symlink or hard link pointing out, or a device/FIFO."""
    members = tar.getmembers()
    for m in members:
        bad = None
        if _escapes(m.name):
            bad = "would be written outside the target folder"
        elif m.issym() and _link_escapes(posixpath.dirname(m.name), m.linkname):
            bad = f"is a symlink to {m.linkname!r}, outside the target folder"
        elif m.islnk() and (_escapes(m.linkname) or _link_escapes("", m.linkname)):
            bad = f"is a hard link to {m.linkname!r}, outside the target folder"
        elif not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
            bad = "is a device or FIFO"
        if bad:
            raise DownloadError(f"{archive}: unsafe archive, member {m.name!r} {bad}; nothing was unpacked")
    return members


def check_zip_members(zf: zipfile.ZipFile, archive: str | os.PathLike) -> None:
    for info in zf.infolist():
        if _escapes(info.filename):
            raise DownloadError(f"{archive}: unsafe archive, member {info.filename!r} would be "
                                "written outside the target folder; nothing was unpacked")
        if (info.external_attr >> 16) & 0o170000 == 0o120000:
            raise DownloadError(f"{archive}: unsafe archive, member {info.filename!r} is a "
                                "symlink; nothing was unpacked")


def unpacked_name(archive: str) -> str:
    for suffix in (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar", ".zip"):
        if archive.endswith(suffix):
            return archive[: -len(suffix)]
    return archive + ".d"


def safe_unpack(archive: str | os.PathLike, dest: str | os.PathLike) -> Path:
    """Unpack a tar (any compression) or zip archive into DEST, which appears only when complete
    (unpacked into a temporary sibling, then renamed). Members are checked before anything is
    written; tar extraction also runs under Python's "data" filter where it exists."""
    archive, dest = Path(archive), Path(dest)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if not tarfile.is_tarfile(archive) and zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                check_zip_members(zf, archive)
                zf.extractall(tmp)
        else:
            try:
                tar = tarfile.open(archive, "r:*")
            except (tarfile.TarError, OSError) as e:
                raise DownloadError(f"{archive}: not a readable archive ({e})") from None
            with tar:
                members = check_tar_members(tar, archive)
                if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4
                    tar.extractall(tmp, members=members, filter="data")
                else:  # pragma: no cover - older Pythons rely on check_tar_members alone
                    tar.extractall(tmp, members=members)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except (tarfile.TarError, zipfile.BadZipFile, OSError) as e:
        raise DownloadError(f"{archive}: cannot unpack ({_reason(e)})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


UNPACKED_STAMP = ".deepinit-unpacked-from"  # in an unpacked folder: the archive's SHA-256


def unpacked_from(dest: str | os.PathLike) -> str | None:
    """The SHA-256 of the archive DEST was unpacked from (its stamp), or None."""
    try:
        return (Path(dest) / UNPACKED_STAMP).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def unpack_once(archive: str | os.PathLike, dest: str | os.PathLike, sha256: str) -> bool:
    """safe_unpack ARCHIVE into DEST unless DEST was already unpacked from an archive with this
    SHA-256 (its stamp says so); True when it unpacked."""
    if unpacked_from(dest) == sha256:
        return False
    safe_unpack(archive, dest)
    (Path(dest) / UNPACKED_STAMP).write_text(sha256 + "\n", encoding="utf-8")
    return True


def local_record(remote: RemoteFile, folder: str | os.PathLike) -> dict | None:
    """The downloads.json-style record of FOLDER/NAME as it is (no fetching), or None when the
    file is not there: its SHA-256 from FOLDER/downloads.json when size and mtime still match,
    else computed; `verified` when it equals the known hash, `url` when the manifest has one."""
    path = Path(folder) / remote.name
    try:
        stat = path.stat()
    except OSError:
        return None
    if not path.is_file():
        return None
    old = _read_manifest(Path(folder)).get(remote.name, {})
    same = old.get("bytes") == stat.st_size and old.get("mtime_ns") == stat.st_mtime_ns
    sha = old["sha256"] if same and old.get("sha256") else pooch.file_hash(str(path))
    return {"file": remote.name, **({"url": old["url"]} if same and old.get("url") else {}),
            "sha256": sha, "verified": remote.sha256 is not None and sha == remote.sha256,
            "bytes": stat.st_size}


# --------------------------------------------------------------------------------------------
# A whole corpus


def download(name: str, folder: str | os.PathLike | None = None, mirror: str | None = None,
             progressbar: bool = False, progress=print,
             files: Sequence[RemoteFile] | None = None) -> dict:
    """Fetch (and unpack, where the corpus says so) every file of corpus `name` into FOLDER
    (default DATA_ROOT/downloads/NAME). Files already there are kept when they match the known
    hash (or, without one, as they are). Returns {"folder": ..., "files": [record, ...]}; the
    records are what prepare.json keeps. `files` replaces the corpus's list (for tests)."""
    if name not in CORPORA:
        raise DownloadError(f"unknown corpus {name!r}; known: {', '.join(CORPORA)}")
    corpus = CORPORA[name]
    folder = Path(folder) if folder is not None else download_dir(name)
    records = []
    for remote in (corpus.files if files is None else files):
        progress(f"{name}: {remote.name}")
        record = fetch_file(remote, folder, mirror=mirror, progressbar=progressbar,
                            manual=corpus.manual, corpus=name)
        if remote.unpack:
            dest = folder / unpacked_name(remote.name)
            if unpacked_from(dest) != record["sha256"]:
                progress(f"{name}: unpacking {remote.name}")
                unpack_once(folder / remote.name, dest, record["sha256"])
            record["unpacked"] = dest.name
        records.append(record)
    return {"folder": str(folder), "files": records}
