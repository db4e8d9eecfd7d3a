"""data=text (runner/data/lm.py load_text): any folder of .txt files as a task=lm corpus, byte-level
BPE learned on the first 90% of the lines, the last 10% validating; metrics per token; `deepinit
sample` decoding with the tokenizer saved in the run folder; bad folders as one-line errors."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from runner.data.corpus import CorpusError
from runner.data.lm import BPEVocab, load_text
from tests.conftest import compose, run_cli_here

WORDS = ["the", "king", "queen", "crown", "sword", "night", "speak", "thou", "art", "my", "lord",
         "é", "naïve", "—"]


def write_corpus(folder, lines=200, seed=0):
    """Two files, one in a subfolder, of seeded random word lines (non-ASCII characters included)."""
    rng = np.random.default_rng(seed)
    text = ["".join(" ".join(rng.choice(WORDS, size=rng.integers(3, 12))) + ("," if i % 3 else ".")) + "\n"
            for i in range(lines)]
    (folder / "b").mkdir(parents=True, exist_ok=True)
    (folder / "a.txt").write_text("".join(text[:lines // 2]), encoding="utf-8")
    (folder / "b" / "c.txt").write_text("".join(text[lines // 2:]).rstrip("\n"), encoding="utf-8")
    (folder / "notes.md").write_text("not read\n")
    return text


def data_cfg(folder, merges=100, block=16):
    return SimpleNamespace(dir=None if folder is None else str(folder), train_split="train",
                           valid_split="valid", bpe_merges=merges, block_size=block)


def test_the_first_90_percent_of_lines_train_and_the_bpe_round_trips(tmp_path):
    lines = write_corpus(tmp_path)
    data = load_text(data_cfg(tmp_path))
    assert data.unit == "token" and data.stats["files"] == 2 and data.stats["lines"] == 200
    assert data.stats["train_lines"] == 180 and data.stats["valid_lines"] == 20
    # files in sorted path order (a.txt, then b/c.txt, whose missing final newline is added)
    assert data.vocab.decode(data.splits["train"]) == "".join(lines[:180])
    assert data.vocab.decode(data.splits["valid"]) == "".join(lines[180:])
    assert 256 < len(data.vocab) <= 256 + 100  # the byte alphabet plus at most 100 merges
    assert len(data.splits["train"]) < sum(len(s.encode()) for s in lines[:180])  # merges compress
    assert int(data.splits["train"].max()) < len(data.vocab)


def test_the_bpe_is_the_same_on_every_run(tmp_path):
    write_corpus(tmp_path)
    a, b = load_text(data_cfg(tmp_path)), load_text(data_cfg(tmp_path))
    assert a.vocab.json == b.vocab.json
    assert np.array_equal(a.splits["train"], b.splits["train"])
    again = BPEVocab(a.vocab.json)  # as `deepinit sample` reloads it
    assert np.array_equal(again.encode("the king speaks, naïve\n"), a.vocab.encode("the king speaks, naïve\n"))


@pytest.mark.parametrize("case, expected", [
    ("none", "data=text needs data.dir=DIR"),
    ("missing", "no such folder"),
    ("empty", "the folder is empty"),
    ("no_txt", "no .txt files"),
    ("short", "needs at least 2 lines"),
    ("binary", "not UTF-8 text"),
    ("tiny_blocks", "shorter than data.block_size + 1 = 1001"),
])
def test_bad_folders_are_one_line_errors(tmp_path, case, expected):
    folder = tmp_path / "corpus"
    if case != "missing":
        folder.mkdir()
    if case == "no_txt":
        (folder / "a.md").write_text("text\n")
    elif case == "short":
        (folder / "a.txt").write_text("one line\n")
    elif case == "binary":
        (folder / "a.txt").write_bytes(b"\xff\xfe\x00abc\n" * 20)
    elif case == "tiny_blocks":
        write_corpus(folder, lines=30)
    cfg = data_cfg(None if case == "none" else folder, block=1000 if case == "tiny_blocks" else 16)
    with pytest.raises(CorpusError) as err:
        load_text(cfg)
    message = str(err.value)
    assert expected in message and "\n" not in message
    if case in ("missing", "empty", "no_txt"):
        assert f"data.dir={folder}" in message


def test_a_missing_folder_from_the_command_line_is_one_line_and_exit_2(tmp_path):
    proc = run_cli_here(["train", "task=lm", "data=text", f"data.dir={tmp_path / 'nowhere'}"], cwd=tmp_path)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "data.dir=" in lines[0] and "no such folder" in lines[0]


TINY_TEXT = ["task=lm", "data=text", "data.bpe_merges=60", "model=ci", "model.max_positions=16",
             "data.block_size=16", "data.batch_size=4", "trainer.max_updates=12", "trainer.log_interval=3",
             "trainer.valid_interval=6", "trainer.save_interval=6", "trainer.tensorboard=false",
             "warmup.updates=3", "optim.lr=1e-2", "trainer.threads=1", "trainer.progress=false",
             "trainer.keep_checkpoints=0"]


def test_a_text_folder_trains_reports_bits_per_token_and_samples(tmp_path):
    from runner.run.train import train

    corpus = tmp_path / "corpus"
    write_corpus(corpus)
    run = tmp_path / "run"
    result = train(compose([*TINY_TEXT, f"data.dir={corpus}"]), run)
    assert result["status"] == "ok" and result["updates"] == 12
    assert result["valid_bpt"] == pytest.approx(result["valid_nll_loss"] / math.log(2))
    assert result["best_valid_bpt"] == pytest.approx(result["best_valid_nll"] / math.log(2))
    assert "valid_bpc" not in result and result["epochs"] is None and result["task"] == "lm"
    assert result["train_tokens"] == 12 * 4 * 16
    vocab = json.loads((run / "vocab.json").read_text())
    assert vocab["unit"] == "token" and vocab["bpe"]["model"]["type"] == "BPE"
    assert result["valid_nll_loss"] < math.log(256 + 60)  # below the uniform distribution's NLL
    valid = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["split"] == "valid"]
    assert [v["step"] for v in valid] == [6, 12] and all("bpt" in v and "bpc" not in v for v in valid)
    proc = run_cli_here(["sample", str(run), "--prompt", "the king", "--tokens", "8", "--temperature", "0"],
                        cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("the king") and len(proc.stdout.rstrip("\n")) > len("the king")


def test_an_lm_summary_shows_tokens_seen_and_translation_keeps_epochs():
    from rich.console import Console

    from runner.console import summary_table

    def rendered(result):
        console = Console(record=True, width=120)
        console.print(summary_table(result))
        return console.export_text()

    base = {"status": "ok", "updates": 2000, "train_tokens": 18_432_000, "tokens_per_s": 9000.0}
    lm = rendered({**base, "task": "lm", "epochs": None})
    assert "updates / tokens seen" in lm and "2000 / 18,432,000" in lm and "epochs" not in lm
    translation = rendered({**base, "epochs": 3})
    assert "updates / epochs" in translation and "2000 / 3" in translation
    assert "target tokens/s" in translation and "target tokens/s" not in lm


def test_resuming_after_the_folder_changed_is_one_line_not_other_token_ids(tmp_path):
    """data=text learns its BPE afresh on every start: a resumed run whose folder changed would
    train its checkpoint on other token ids. It is refused in one line, exit 2; the unchanged
    folder resumes."""
    from runner.run.train import train

    corpus, run = tmp_path / "corpus", tmp_path / "run"
    write_corpus(corpus)
    first = train(compose([*TINY_TEXT, f"data.dir={corpus}", "trainer.max_updates=6"]), run)
    assert first["status"] == "ok" and (run / "checkpoint_last.pt").is_file()
    (run / "result.json").unlink()  # not finished: the next start resumes from the checkpoint
    write_corpus(corpus, seed=1)  # other lines, so another BPE
    args = ["train", *TINY_TEXT, f"data.dir={corpus}", f"hydra.run.dir={run}"]
    proc = run_cli_here(args, cwd=tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "the corpus changed since this run started" in lines[0] and "vocab.json" in lines[0]
    write_corpus(corpus)  # as it was: the run resumes and finishes
    resumed = train(compose([*TINY_TEXT, f"data.dir={corpus}"]), run)
    assert resumed["status"] == "ok" and resumed["updates"] == 12 and resumed["resumed"]


def test_the_resume_check_reads_token_ids_not_the_tokenizer_json_layout(tmp_path):
    """`tokenizers` writes merges as "a b" strings or [a, b] pairs depending on its version: the
    same BPE in either layout passes the check, another BPE does not."""
    from runner.run.sample import VOCAB_FILE, check_saved_vocab, vocab_record

    corpus = tmp_path / "corpus"
    lines = write_corpus(corpus)
    vocab = BPEVocab.learn(lines, 40)
    record = vocab_record(vocab, "token")
    merges = record["bpe"]["model"]["merges"]
    other_layout = [m.split(" ") if isinstance(m, str) else " ".join(m) for m in merges]
    record["bpe"]["model"]["merges"] = other_layout
    (tmp_path / VOCAB_FILE).write_text(json.dumps(record))
    check_saved_vocab(tmp_path, vocab, "token")  # same ids: no error
    with pytest.raises(CorpusError, match="the corpus changed since this run started"):
        check_saved_vocab(tmp_path, BPEVocab.learn(lines, 20), "token")


def test_a_data_error_inside_ddp_ranks_is_one_line_and_exit_2(tmp_path):
    """trainer.devices=2 builds the data in the spawned ranks: their CorpusError reaches the
    command as its one line, not as the ranks' tracebacks."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("one line only\n")
    proc = run_cli_here(["train", *TINY_TEXT, f"data.dir={corpus}", "trainer.devices=2",
                         f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(lines) == 1 and "data=text needs at least 2 lines" in lines[0], lines
    assert not list((tmp_path / "run").glob(".user-error*"))  # read and removed
