"""BPE: exact reproduction of fairseq's IWSLT'14 segmentation, and the tokenizers learner."""
import gzip
import subprocess
import sys
from pathlib import Path

import pytest

from runner.data.dictionary import Dictionary
from runner.data.subword import BPEError, SubwordNmtCodes, learn_bpe, remove_bpe
from tests.conftest import needs_staged, staged_data

IWSLT = staged_data("iwslt14-de-en-fairseq")
M30K = staged_data("multi30k/tok")
needs_iwslt = needs_staged("iwslt14-de-en-fairseq", "staged IWSLT'14 data")
needs_m30k = needs_staged("multi30k/tok", "staged Multi30k tok/ files")


def _gz_text(path: Path) -> str:
    with gzip.open(path, "rt", encoding="utf-8", newline="") as f:
        return f.read()


@needs_iwslt
def test_codes_header_is_version_0_2_not_a_merge():
    codes = SubwordNmtCodes.from_file(IWSLT / "code.gz")
    assert codes.version == (0, 2)
    assert codes.num_merges == 10000  # prepare-iwslt14.sh: learn_bpe.py -s 10000; the header is not a merge


@needs_iwslt
@pytest.mark.parametrize("split", ["valid", "test"])
def test_applying_fairseq_codes_reproduces_prepared_text_byte_for_byte(split):
    codes = SubwordNmtCodes.from_file(IWSLT / "code.gz")
    for lang in ("de", "en"):
        source = _gz_text(IWSLT / "tmp" / f"{split}.{lang}.gz")
        expected = _gz_text(IWSLT / f"{split}.{lang}.gz")
        lines = source.split("\n")
        assert lines[-1] == ""  # newline-terminated: the join below restores it
        produced = "\n".join(codes.apply(lines[:-1])) + "\n"
        assert produced.encode("utf-8") == expected.encode("utf-8")


def test_bad_codes_file_is_reported_not_exited(tmp_path):
    p = tmp_path / "code"
    p.write_text("#version: 0.2\ne n</w>\nthis line has three\n", encoding="utf-8")
    with pytest.raises(BPEError, match=r"code:3: a merge line must be two symbols"):
        SubwordNmtCodes.from_file(p)
    p.write_text("e n</w>\n", encoding="utf-8")
    with pytest.raises(BPEError, match="#version"):
        SubwordNmtCodes.from_file(p)
    with pytest.raises(BPEError, match="not found"):
        SubwordNmtCodes.from_file(tmp_path / "nope")


def _m30k_lines(n):
    lines = []
    for lang in ("de", "en"):
        lines += _gz_text(M30K / f"train.lc.norm.tok.{lang}.gz").split("\n")[:n]
    return lines


@needs_m30k
def test_learned_bpe_roundtrips_and_has_requested_merges():
    lines = _m30k_lines(3000)
    codes = learn_bpe(lines, 500)
    assert codes.num_merges == 500
    assert codes.text.startswith("#version: 0.2\n")
    assert all(len(line.split(" ")) == 2 for line in codes.text.splitlines()[1:])
    segmented = codes.apply(lines)
    assert sum(len(s.split()) for s in segmented) > sum(len(s.split()) for s in lines)
    assert any("@@ " in s for s in segmented)
    d = Dictionary.build([s.split() for s in segmented])
    for original, seg in zip(lines, segmented):
        assert remove_bpe(seg) == " ".join(original.split())
        assert d.string(d.encode_line(seg), bpe_symbol="@@ ") == " ".join(original.split())
    # Unseen characters are kept as single symbols, never dropped.
    assert remove_bpe(codes.apply_line("ǂxylophonê zwei")) == "ǂxylophonê zwei"


def test_learned_bpe_merges_the_most_frequent_pair_first():
    # Word counts: low 9, lower 3, lowest 3, lo 3. Pair counts: (l, o) 15 wins; then
    # (lo, w</w>) 9 beats (lo, w) 6 and (w, e) 6: the final symbol w</w> is atomic, as in
    # subword-nmt's version-0.2 codes.
    lines = ["low low low lower lowest lo"] * 3
    codes = learn_bpe(lines, 3)
    merges = codes.text.splitlines()[1:]
    assert merges[:2] == ["l o", "lo w</w>"]
    assert merges[2] in ("w e", "lo w")  # a 6-6 tie
    assert codes.apply_line("low lo") == "low l@@ o"  # no merge made o</w>
    assert remove_bpe(codes.apply_line("low lower")) == "low lower"


@needs_m30k
def test_learned_bpe_is_deterministic_across_processes():
    # tokenizers' trainer breaks count ties by hash-ordered ids unless word-final symbols are
    # remapped (see subword.py); a fresh interpreter gets a fresh hash seed.
    script = ("import gzip,hashlib;from runner.data.subword import learn_bpe;"
              f"p={str(M30K / 'train.lc.norm.tok.{}.gz')!r};"
              "L=[l for g in 'de en'.split() for l in gzip.open(p.format(g),'rt',encoding='utf-8')"
              ".read().split(chr(10))[:3000]];"
              "print(hashlib.sha256(learn_bpe(L,800).text.encode()).hexdigest())")
    root = Path(__file__).resolve().parents[2]
    runs = {subprocess.run([sys.executable, "-c", script], cwd=root, check=True,
                           capture_output=True, text=True).stdout.strip() for _ in range(2)}
    import hashlib
    here = hashlib.sha256(learn_bpe(_m30k_lines(3000), 800).text.encode()).hexdigest()
    assert runs == {here}


def test_learn_bpe_rejects_bad_requests():
    with pytest.raises(BPEError, match=">= 1"):
        learn_bpe(["a b"], 0)
    with pytest.raises(BPEError, match="no symbol pair occurs 2 or more times"):
        learn_bpe(["ab cd"], 5)
    with pytest.raises(BPEError, match="no merges"):
        SubwordNmtCodes("#version: 0.2\n")
    with pytest.raises(BPEError, match="private-use"):
        learn_bpe(["a \U000F0001b"], 5)
