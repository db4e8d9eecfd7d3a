"""data=shakespeare_char (runner/data/lm.py): nanoGPT's character vocabulary and 90/10 split,
batches as a pure function of (seed, update), validation blocks covering the split once, and the
download entry served from a local HTTP server."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from runner.data.corpus import CorpusError
from runner.data.lm import (
    CharVocab,
    load_shakespeare_char,
    shakespeare_file,
    training_batch,
    training_block_offsets,
    unigram_nll,
    validation_batches,
)
from tests.conftest import needs_shakespeare
from tests.data.http_files import FileServer


def data_cfg(folder=None):
    return SimpleNamespace(dir=None if folder is None else str(folder), train_split="train",
                           valid_split="valid")


def test_vocab_is_the_sorted_characters_and_round_trips():
    vocab = CharVocab.of("hello world")
    assert vocab.chars == " dehlorw"
    ids = vocab.encode("world hello")
    assert ids.tolist() == [7, 5, 6, 4, 1, 0, 3, 2, 4, 4, 5]
    assert vocab.decode(ids) == "world hello"
    with pytest.raises(CorpusError, match="'z'"):
        vocab.encode("zoo")


@needs_shakespeare
def test_split_and_vocabulary_match_nanogpt():
    data = load_shakespeare_char(data_cfg())
    # nanoGPT data/shakespeare_char/prepare.py prints: vocab size 65, train has 1,003,854 tokens,
    # val has 111,540 tokens
    assert len(data.vocab) == 65
    assert len(data.splits["train"]) == 1_003_854
    assert len(data.splits["valid"]) == 111_540
    assert data.vocab.decode(data.splits["train"][:14]) == "First Citizen:"


def test_a_changed_file_is_refused_with_one_line(tmp_path):
    (tmp_path / "input.txt").write_text("not shakespeare\n")
    with pytest.raises(CorpusError) as err:
        load_shakespeare_char(data_cfg(tmp_path))
    assert "SHA-256" in str(err.value) and str(tmp_path / "input.txt") in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_file_names_where_it_looked_and_the_download_command(tmp_path):
    with pytest.raises(CorpusError, match="deepinit data download tinyshakespeare"):
        load_shakespeare_char(data_cfg(tmp_path / "nowhere"))


def test_training_blocks_are_a_pure_function_of_seed_and_update():
    ids = np.arange(1000, dtype=np.int64)
    a = training_block_offsets(len(ids), 16, 8, seed=3, update=5)
    assert np.array_equal(a, training_block_offsets(len(ids), 16, 8, seed=3, update=5))
    assert not np.array_equal(a, training_block_offsets(len(ids), 16, 8, seed=3, update=6))
    assert not np.array_equal(a, training_block_offsets(len(ids), 16, 8, seed=4, update=5))
    offsets = np.concatenate([training_block_offsets(len(ids), 16, 8, 1, u) for u in range(500)])
    assert offsets.min() == 0 and offsets.max() == 1000 - 16 - 1  # every start a full block + 1 fits
    x, y = training_batch(ids, 16, 8, seed=3, update=5)
    assert x.shape == y.shape == (8, 16)
    assert np.array_equal(x[:, 0].numpy(), a)  # ids are positions here: the block starts at a
    assert np.array_equal(y.numpy(), x.numpy() + 1)  # targets are the next tokens


def test_validation_reads_consecutive_blocks_once():
    ids = np.arange(103, dtype=np.int64)
    batches = validation_batches(ids, block_size=10, batch_size=4)
    inputs = np.concatenate([x.numpy() for x, _ in batches])
    assert [x.shape[0] for x, _ in batches] == [4, 4, 2]  # (103 - 1) // 10 = 10 blocks
    assert np.array_equal(inputs.ravel(), np.arange(100))
    assert np.array_equal(np.concatenate([y.numpy() for _, y in batches]).ravel(), np.arange(1, 101))
    assert len(validation_batches(ids, 10, 4, max_batches=2)) == 2


def test_unigram_nll_is_the_add_one_unigram_cross_entropy():
    train = np.array([0, 0, 0, 1])
    valid = np.array([0, 1, 2])
    p = np.array([4, 2, 1]) / 7  # counts + 1 over a vocabulary of 3
    assert unigram_nll(train, valid, 3) == pytest.approx(-np.log(p).mean())
    assert math.isclose(unigram_nll(train, valid, 3), -(math.log(4 / 7) + math.log(2 / 7) + math.log(1 / 7)) / 3)


@needs_shakespeare
def test_download_fetches_the_corpus_and_the_loader_finds_it(tmp_path, monkeypatch, capsys):
    """`deepinit data download tinyshakespeare` (served from 127.0.0.1) puts input.txt where
    data=shakespeare_char looks when data.dir is unset."""
    from runner.cli import main as deepinit_main

    text = shakespeare_file(None).read_bytes()
    monkeypatch.setenv("DEEPINIT_DATA_ROOT", str(tmp_path / "root"))
    server = FileServer()
    try:
        server.files["/input.txt"] = text
        monkeypatch.setenv("DEEPINIT_DOWNLOAD_MIRROR", server.url + "/")
        with pytest.raises(SystemExit) as done:
            deepinit_main(["data", "download", "tinyshakespeare", "--no-progress"])
        assert done.value.code == 0
        # the closing hint is a command that finds it: no data.dir for the default folder...
        assert capsys.readouterr().out.rstrip().endswith("deepinit train task=lm data=shakespeare_char")
        elsewhere = tmp_path / "elsewhere"
        with pytest.raises(SystemExit) as done:
            deepinit_main(["data", "download", "tinyshakespeare", "--no-progress", "--dir", str(elsewhere)])
        # ...and the folder for another
        hint = capsys.readouterr().out.rstrip().splitlines()[-1]
        assert done.value.code == 0 and hint.endswith(f"data=shakespeare_char data.dir={elsewhere}")
    finally:
        server.close()
    assert (tmp_path / "root" / "downloads" / "tinyshakespeare" / "input.txt").read_bytes() == text
    assert len(load_shakespeare_char(data_cfg()).vocab) == 65
    assert len(load_shakespeare_char(data_cfg(str(elsewhere))).vocab) == 65


def test_download_entry_carries_the_corpus_checksum():
    from runner.data.download import CORPORA
    from runner.data.lm import SHAKESPEARE_SHA256

    (remote,) = CORPORA["tinyshakespeare"].files
    assert remote.name == "input.txt" and remote.sha256 == SHAKESPEARE_SHA256
