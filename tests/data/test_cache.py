"""Binary data cache: hit, stale inputs or settings rebuild, corrupt folders rebuild."""
from pathlib import Path

import numpy as np

from runner.config import DataConfig
from runner.data.cache import cache_key, cached
from runner.data.corpus import load_translation_data
from runner.data.dataset import TokenizedSplit, TranslationData
from runner.data.dictionary import Dictionary


def _corpus(d: Path):
    d.mkdir(parents=True, exist_ok=True)
    src = "ein hund läuft .\nzwei katzen schlafen .\nder mann isst .\n"
    tgt = "a dog runs .\ntwo cats sleep .\nthe man eats .\n"
    for split in ("train", "valid", "test"):
        (d / f"{split}.de").write_text(src, encoding="utf-8")
        (d / f"{split}.en").write_text(tgt, encoding="utf-8")


def _cfg(tmp_path, **kw):
    return DataConfig(name="custom", dir=str(tmp_path / "corpus"),
                      cache_dir=str(tmp_path / "cache"), **kw)


def _same(a: TranslationData, b: TranslationData):
    assert a.src_dict == b.src_dict and a.tgt_dict == b.tgt_dict
    assert a.src_dict.counts == b.src_dict.counts
    assert a.references == b.references and a.bpe_symbol == b.bpe_symbol
    assert list(a.splits) == list(b.splits)
    for k in a.splits:
        for name, arr in a.splits[k].arrays().items():
            np.testing.assert_array_equal(arr, b.splits[k].arrays()[name])
            assert arr.dtype == b.splits[k].arrays()[name].dtype


def test_second_load_is_a_hit_with_identical_data(tmp_path):
    _corpus(tmp_path / "corpus")
    first = load_translation_data(_cfg(tmp_path))
    second = load_translation_data(_cfg(tmp_path))
    assert first.stats["cache"]["status"] == "built"
    assert second.stats["cache"]["status"] == "hit"
    _same(first, second)
    assert second.src_dict is second.tgt_dict  # a joined dictionary stays one object
    assert second.stats["splits"]["train"]["pairs"] == 3


def test_edited_input_or_setting_rebuilds(tmp_path):
    _corpus(tmp_path / "corpus")
    load_translation_data(_cfg(tmp_path))
    # Same size and name, different content: the content hash catches it.
    p = tmp_path / "corpus" / "train.en"
    p.write_text(p.read_text(encoding="utf-8").replace("dog", "cat"), encoding="utf-8")
    again = load_translation_data(_cfg(tmp_path))
    assert again.stats["cache"]["status"] == "built"
    assert "cat" in again.tgt_dict and "dog" not in again.tgt_dict
    other = load_translation_data(_cfg(tmp_path, joined_dictionary=False))
    assert other.stats["cache"]["status"] == "built" and not other.joined
    assert len(list((tmp_path / "cache" / "data").iterdir())) == 3


def test_corrupt_cache_is_rebuilt(tmp_path):
    _corpus(tmp_path / "corpus")
    built = load_translation_data(_cfg(tmp_path))
    folder = Path(built.stats["cache"]["path"])
    npz = folder / "splits.npz"
    npz.write_bytes(npz.read_bytes()[:100])
    rebuilt = load_translation_data(_cfg(tmp_path))
    assert rebuilt.stats["cache"]["status"] == "built"
    _same(built, rebuilt)
    (folder / "meta.json").write_text("{not json", encoding="utf-8")
    assert load_translation_data(_cfg(tmp_path)).stats["cache"]["status"] == "built"
    assert load_translation_data(_cfg(tmp_path)).stats["cache"]["status"] == "hit"
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".tmp-")]


def test_cached_calls_build_once_and_survives_unwritable_dir(tmp_path):
    calls = []

    def build():
        calls.append(1)
        d = Dictionary(["a", "b"])
        return TranslationData(d, d, {"train": TokenizedSplit.from_lists([[4, 2]], [[5, 2]])},
                               {}, None, {"n": 1})

    key = {"x": 1, "file": tmp_path / "f"}
    (tmp_path / "f").write_text("hello", encoding="utf-8")
    a = cached(key, build, cache_dir=tmp_path / "c")
    b = cached(key, build, cache_dir=tmp_path / "c")
    assert len(calls) == 1 and b.stats["cache"]["status"] == "hit" and b.stats["n"] == 1
    _same(a, b)
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the cache folder should go", encoding="utf-8")
    c = cached(key, build, cache_dir=blocker)
    assert c.stats["cache"]["status"] == "unwritable" and len(calls) == 2
    # Keys follow file content, not just the path.
    k1 = cache_key(key)
    (tmp_path / "f").write_text("hellO", encoding="utf-8")
    assert cache_key(key) != k1
