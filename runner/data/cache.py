"""Binary cache of prepared corpora, so a second run starts in seconds.

One folder per key under `<root>/data/<name>-<hash>/`:
  meta.json        key, format version, split names, stats, sha256 of every other file
  splits.npz       the TokenizedSplit arrays (np.savez, no pickle)
  src_dict.txt / tgt_dict.txt (or dict.txt when joined)   fairseq dict.txt format
  references.json  tokenized reference lines per split
  raw_references.json  the raw reference lines per split (data.tokenize=moses only)

The key is a hash of the inputs' identities (path, size, content sha256) and every setting that
changes the result, so editing a corpus file or a setting selects a new folder. The folder is
written under a temporary name and renamed into place (atomic on one filesystem); a folder that
fails any check when read is deleted and rebuilt. Deleting the whole cache is always safe.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable

import numpy as np

from runner.data.dataset import TokenizedSplit, TranslationData
from runner.data.dictionary import Dictionary

log = logging.getLogger("deepinit.data")

CACHE_FORMAT = 1  # bump when the layout or the meaning of a cached field changes
_ARRAYS = ("src_tokens", "src_offsets", "tgt_tokens", "tgt_offsets")


class CacheCorrupt(Exception):
    """A cache folder that fails a check; the caller rebuilds it."""


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """data.cache_dir, else $DEEPINIT_CACHE, else ~/.cache/deepinit."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    env = os.environ.get("DEEPINIT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "deepinit"


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_identity(path: str | os.PathLike) -> dict[str, Any]:
    """What identifies an input file: absolute path, size and content hash (mtime alone misses
    edits that keep it, e.g. copies with preserved timestamps)."""
    p = Path(path).resolve()
    return {"path": str(p), "size": p.stat().st_size, "sha256": _sha256_file(p)}


def _normalize(obj: Any) -> Any:
    """Paths become file identities; containers are normalized recursively."""
    if isinstance(obj, Path):
        return file_identity(obj)
    if isinstance(obj, dict):
        return {str(k): _normalize(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_normalize(v) for v in obj]
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    raise TypeError(f"cache key part of type {type(obj).__name__} is not supported: {obj!r}")


def cache_key(key_parts: dict[str, Any]) -> str:
    """sha256 over the normalized key parts; `pathlib.Path` values are hashed by identity."""
    blob = json.dumps({"format": CACHE_FORMAT, "parts": _normalize(key_parts)}, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def save(folder: Path, data: TranslationData, key: str) -> None:
    """Write `data` into `folder` (which must not exist) atomically."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".tmp-{folder.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        arrays = {f"{split}.{name}": arr for split, s in data.splits.items()
                  for name, arr in s.arrays().items()}
        np.savez(tmp / "splits.npz", **arrays)
        joined = data.src_dict is data.tgt_dict
        if joined:
            data.src_dict.save(tmp / "dict.txt")
        else:
            data.src_dict.save(tmp / "src_dict.txt")
            data.tgt_dict.save(tmp / "tgt_dict.txt")
        (tmp / "references.json").write_text(json.dumps(data.references, ensure_ascii=False),
                                             encoding="utf-8")
        raw_references = getattr(data, "raw_references", None)
        if raw_references:
            (tmp / "raw_references.json").write_text(
                json.dumps(raw_references, ensure_ascii=False), encoding="utf-8")
        files = {p.name: _sha256_file(p) for p in sorted(tmp.iterdir())}
        meta = {"format": CACHE_FORMAT, "key": key, "splits": list(data.splits), "joined": joined,
                "bpe_symbol": data.bpe_symbol, "stats": data.stats, "files": files}
        (tmp / "meta.json").write_text(json.dumps(meta, ensure_ascii=False, indent=1),
                                       encoding="utf-8")
        try:
            os.rename(tmp, folder)
        except OSError:
            if not folder.exists():
                raise
            # Another process finished the same key first; its copy is equivalent.
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load(folder: Path, key: str) -> TranslationData:
    """Read a cache folder, checking its key and every file's hash; CacheCorrupt on any fault."""
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        if meta.get("format") != CACHE_FORMAT or meta.get("key") != key:
            raise CacheCorrupt("format or key differs")
        for name, digest in meta["files"].items():
            if _sha256_file(folder / name) != digest:
                raise CacheCorrupt(f"{name} does not match its recorded hash")
        if meta["joined"]:
            src_dict = tgt_dict = Dictionary.load(folder / "dict.txt")
        else:
            src_dict = Dictionary.load(folder / "src_dict.txt")
            tgt_dict = Dictionary.load(folder / "tgt_dict.txt")
        with np.load(folder / "splits.npz", allow_pickle=False) as z:
            splits = {s: TokenizedSplit(*(z[f"{s}.{n}"] for n in _ARRAYS)) for s in meta["splits"]}
        references = json.loads((folder / "references.json").read_text(encoding="utf-8"))
        raw_references = (json.loads((folder / "raw_references.json").read_text(encoding="utf-8"))
                          if "raw_references.json" in meta["files"] else {})
    except CacheCorrupt:
        raise
    except Exception as e:  # any unreadable piece means the folder cannot be trusted
        raise CacheCorrupt(f"{type(e).__name__}: {e}") from e
    return TranslationData(src_dict, tgt_dict, splits, references, meta["bpe_symbol"],
                           dict(meta["stats"]), raw_references)


def cached(key_parts: dict[str, Any], build_fn: Callable[[], TranslationData], *,
           cache_dir: str | os.PathLike | None = None, name: str = "data",
           enabled: bool = True) -> TranslationData:
    """Return the cached TranslationData for `key_parts`, building (and storing) it with
    `build_fn()` when absent, stale or corrupt. `stats['cache']` says which happened. A cache
    that cannot be written (read-only disk) only costs a warning."""
    if not enabled:
        data = build_fn()
        data.stats["cache"] = {"status": "disabled"}
        return data
    key = cache_key(key_parts)
    folder = cache_root(cache_dir) / "data" / f"{name}-{key[:16]}"
    if folder.exists():
        try:
            data = load(folder, key)
            data.stats["cache"] = {"status": "hit", "path": str(folder)}
            return data
        except CacheCorrupt as e:
            log.warning("data cache %s is unusable (%s); rebuilding it", folder, e)
            shutil.rmtree(folder, ignore_errors=True)
    data = build_fn()
    data.stats["cache"] = {"status": "built", "path": str(folder)}
    try:
        save(folder, data, key)
    except OSError as e:
        log.warning("could not write the data cache at %s (%s); continuing without it", folder, e)
        data.stats["cache"] = {"status": "unwritable", "path": str(folder)}
    return data
