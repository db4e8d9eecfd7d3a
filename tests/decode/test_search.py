"""Beam search against an independent, unbatched, cache-free reference written from fairseq's
SequenceGenerator rules; greedy against beam 1; checkpoint averaging by hand values."""
from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from runner.data.dataset import TokenizedSplit
from runner.decode.search import beam_search, decode_batches, greedy_search
from runner.run.build import model_for as build_model
from runner.run.folder import average_checkpoints
from tests.conftest import compose

PAD, BOS, EOS = 1, 0, 2
aten = torch.ops.aten
VOCAB = 40


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(3)
    cfg = compose(["model=ci", "model.dropout=0.0", "model.share_embeddings=none"])
    m = build_model(cfg, VOCAB, VOCAB, PAD).eval()
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
        # Point the eos output row along the mean decoder state, so hypotheses end at different
        # steps and some beams finish early (an untrained model would run to the length cap).
        src = sources(seed=99, n=16)
        memory, mask = m.encode(src, True)
        x = m.decoder.embedder(torch.randint(4, VOCAB, (16, 10)))
        for layer in m.decoder.layers:
            x = layer(x, memory, mask)
        mean = m.decoder.final_norm(x).mean((0, 1))
        m.output_weight[EOS] = 2.5 * mean / mean.norm() ** 2
    return m


def sources(seed: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 9, (n,), generator=g)
    src = torch.full((n, int(lengths.max()) + 1), PAD, dtype=torch.long)
    for i, length in enumerate(lengths.tolist()):
        src[i, :length] = torch.randint(4, VOCAB, (length,), generator=g)
        src[i, length] = EOS
    return src


@torch.no_grad()
def reference_beam(model, src: torch.Tensor, beam: int, lenpen: float, max_len: int):
    """One sentence, plain Python lists, the whole decoder recomputed for every hypothesis."""
    src = src[src != PAD][None]
    memory, mask = model.encode(src, False)
    hyps = [([EOS], 0.0)]
    finalized: list[tuple[list[int], float]] = []
    for step in range(max_len + 1):
        cands = []
        for b, (prefix, score) in enumerate(hyps):
            lp = torch.log_softmax(model.decode(torch.tensor([prefix]), memory, mask)[0, -1], -1)
            lp[PAD] = lp[BOS] = -math.inf
            if step == 0:
                lp[EOS] = -math.inf
            if step >= max_len:
                lp = torch.where(torch.arange(VOCAB) == EOS, lp, torch.tensor(-math.inf))
            cands += [(score + float(lp[t]), b, t) for t in range(VOCAB)]
        cands.sort(key=lambda c: -c[0])
        top = cands[:2 * beam]
        for score, b, tok in top[:beam]:
            if tok == EOS and score > -math.inf and len(finalized) < beam:
                finalized.append((hyps[b][0][1:], score / (step + 1) ** lenpen))
        if len(finalized) == beam:
            break
        hyps = [(hyps[b][0] + [tok], score) for score, b, tok in top
                if not (tok == EOS and score > -math.inf)][:beam]
    return max(finalized, key=lambda f: f[1])  # first of equals, like fairseq's stable sort


@pytest.mark.parametrize("beam,lenpen,a,b", [(4, 1.0, 0.0, 12), (3, 0.6, 1.5, 2), (5, 1.3, 1.0, 0)])
def test_batched_cached_beam_equals_reference(model, beam, lenpen, a, b):
    src = sources(seed=beam, n=7)
    out = beam_search(model, src, beam, PAD, BOS, EOS, lenpen=lenpen, max_len_a=a, max_len_b=b)
    lengths = set()
    for i in range(src.shape[0]):
        src_len = int((src[i] != PAD).sum())
        max_len = max(1, min(int(a * src_len + b), model.cfg.max_positions - 1))
        tokens, score = reference_beam(model, src[i], beam, lenpen, max_len)
        assert out.tokens[i] == tokens, f"sentence {i}"
        assert out.scores[i] == pytest.approx(score, abs=1e-4)
        assert len(tokens) <= max_len
        lengths.add(len(tokens))
    assert len(lengths) > 1  # sentences finished at different steps: pruning was exercised


def test_cache_equals_full_recompute(model):
    src = sources(seed=11, n=9)
    kwargs = dict(lenpen=1.0, max_len_a=1.2, max_len_b=10)
    cached = beam_search(model, src, 5, PAD, BOS, EOS, use_cache=True, **kwargs)
    full = beam_search(model, src, 5, PAD, BOS, EOS, use_cache=False, **kwargs)
    assert cached.tokens == full.tokens
    torch.testing.assert_close(torch.tensor(cached.scores), torch.tensor(full.scores),
                               rtol=0, atol=1e-4)


def test_beam_one_equals_greedy(model):
    src = sources(seed=5, n=12)
    for lenpen in (1.0, 0.5):
        greedy = greedy_search(model, src, PAD, BOS, EOS, max_len_a=1.0, max_len_b=3, lenpen=lenpen)
        beam1 = beam_search(model, src, 1, PAD, BOS, EOS, lenpen=lenpen, max_len_a=1.0, max_len_b=3)
        assert greedy.tokens == beam1.tokens
        torch.testing.assert_close(torch.tensor(greedy.scores), torch.tensor(beam1.scores),
                                   rtol=0, atol=1e-5)
    assert any(len(t) < 4 for t in greedy.tokens)  # some stop on eos before the cap


def test_batch_composition_does_not_change_results(model):
    src = sources(seed=8, n=6)
    together = beam_search(model, src, 4, PAD, BOS, EOS, max_len_a=1.0, max_len_b=4)
    for i in range(src.shape[0]):
        row = src[i:i + 1]
        alone = beam_search(model, row[:, :int((row != PAD).sum())], 4, PAD, BOS, EOS,
                            max_len_a=1.0, max_len_b=4)
        assert alone.tokens[0] == together.tokens[i]


def test_max_len_caps_output_and_batch_mode(model):
    src = sources(seed=2, n=5)
    out = beam_search(model, src, 3, PAD, BOS, EOS, max_len_a=0.0, max_len_b=2)
    assert all(1 <= len(t) <= 2 for t in out.tokens)
    # fairseq-generate's cap uses the batch's padded width: never shorter than per sentence
    width = src.shape[1]
    batch = greedy_search(model, src, PAD, BOS, EOS, max_len_a=1.0, max_len_b=0, batch_max_len=True)
    assert all(len(t) <= width for t in batch.tokens)


def test_decode_batches_sorted_and_bounded():
    split = TokenizedSplit.from_lists([[5] * n + [EOS] for n in (7, 1, 4, 9, 2, 2, 6)],
                                      [[5, EOS]] * 7)
    batches = decode_batches(split, max_tokens=12, batch_size=3)
    flat = [int(i) for b in batches for i in b]
    assert sorted(flat) == list(range(7))
    lengths = split.src_lengths
    assert [int(lengths[i]) for i in flat] == sorted(int(x) for x in lengths)
    for b in batches:
        assert len(b) <= 3 and (len(b) == 1 or len(b) * max(int(lengths[i]) for i in b) <= 12)


def test_average_two_known_checkpoints(tmp_path):
    a = {"w": torch.tensor([1.0, 2.0]), "h": torch.tensor([0.5], dtype=torch.float16),
         "count": torch.tensor([3])}
    b = {"w": torch.tensor([3.0, 5.0]), "h": torch.tensor([1.5], dtype=torch.float16),
         "count": torch.tensor([7])}
    torch.save({"model": a, "step": 1}, tmp_path / "checkpoint_1.pt")
    torch.save({"model": b, "step": 2}, tmp_path / "checkpoint_2.pt")
    avg = average_checkpoints([tmp_path / "checkpoint_1.pt", tmp_path / "checkpoint_2.pt"])
    assert avg["w"].tolist() == [2.0, 3.5]
    assert avg["h"].dtype == torch.float16 and avg["h"].tolist() == [1.0]
    assert avg["count"].tolist() == [7]  # integer tensors come from the last checkpoint
    torch.save({"model": {**b, "w": torch.zeros(3)}}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="shape"):
        average_checkpoints([tmp_path / "checkpoint_1.pt", tmp_path / "other.pt"])


def test_beams_keep_their_cache_rows():
    from runner.decode.search import _keep_in_place

    parents = torch.tensor([[0, 0, 1, 3], [2, 2, 2, 2], [3, 2, 1, 0]])
    assert _keep_in_place(parents).tolist() == [[0, 2, 1, 3], [2, 0, 1, 3], [3, 2, 1, 0]]
    g = torch.Generator().manual_seed(0)
    parents = torch.randint(0, 5, (200, 5), generator=g)
    slots = _keep_in_place(parents)
    assert (slots.sort(1).values == torch.arange(5)).all()  # a permutation per sentence
    first = torch.stack([torch.tensor([p[:i].tolist().count(p[i]) == 0 for i in range(5)])
                         for p in parents])
    assert (slots[first] == parents[first]).all()  # a first child stays in its parent's row


class DeviceReads(TorchDispatchMode):
    """Counts the torch ops whose result the host has to wait for on CUDA: a scalar read (item,
    bool, int) and the ops whose output size depends on the data (nonzero, boolean indexing).
    The search keeps its host-side state in numpy, so on CPU every such torch op stands for a
    read of the device."""

    SCALAR = {aten._local_scalar_dense.default, aten.item.default, aten.is_nonzero.default}
    SIZED_BY_DATA = {aten.nonzero.default, aten.masked_select.default, aten.unique_dim.default,
                     aten._unique2.default, aten.unique_consecutive.default, aten.bincount.default}

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        bool_index = func in (aten.index.Tensor, aten.index_put_.default, aten.index_put.default) \
            and any(t is not None and t.dtype == torch.bool for t in args[1])
        sized = func in self.SIZED_BY_DATA or (
            func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None)
        if func in self.SCALAR or sized or bool_index:
            self.ops.append(str(func))
        return func(*args, **kwargs)


def count_transfers(monkeypatch) -> list[str]:
    """Calls that copy between host and device on CUDA, which dispatch cannot see on the CPU
    (there they return the tensor itself or leave torch)."""
    calls: list[str] = []

    def counted(name, moves=lambda *a, **k: True):
        real = getattr(torch.Tensor, name)

        def wrapper(self, *args, **kwargs):
            if moves(*args, **kwargs):
                calls.append(name)
            return real(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, wrapper)

    for name in ("cpu", "cuda", "tolist", "item"):
        counted(name)
    counted("to", lambda *a, **k: "device" in k or any(isinstance(x, (str, torch.device))
                                                       for x in a))
    return calls


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("static", [True, False])
def test_a_decode_step_reads_the_device_once(model, beam, static, monkeypatch):
    """On CUDA every read of the device stops the host from queueing the next kernels; a step
    reads it once (which sentences finished, which cache rows moved), through _to_host.
    static=False: a torch without nonzero_static on CUDA, where the search falls back to
    nonzero (one more wait when rows leave) and gives the same hypotheses."""
    from runner.decode import search

    src = sources(seed=4, n=16)
    expected = search.generate(model, src, beam, PAD, BOS, EOS, max_len_a=1.0, max_len_b=3)
    if not static:
        def missing(*args, **kwargs):
            raise NotImplementedError("aten::nonzero_static: no kernel for this backend")
        monkeypatch.setattr(torch, "nonzero_static", missing)
    reads_of_host = []
    real = search._to_host
    monkeypatch.setattr(search, "_to_host", lambda flags: reads_of_host.append(1) or real(flags))
    steps = []
    decode = model.decode
    monkeypatch.setattr(model, "decode", lambda *a, **k: steps.append(1) or decode(*a, **k))
    transfers = count_transfers(monkeypatch)
    with DeviceReads() as reads:
        out = search.generate(model, src, beam, PAD, BOS, EOS, max_len_a=1.0, max_len_b=3)
    assert out == expected
    assert len(steps) >= 3 and len(reads_of_host) == len(steps)  # one per step
    # per batch: is there padding (a read), the length caps there and back, three result lists
    assert sorted(transfers) == sorted(["cpu"] * (len(steps) + 1) + ["to"] + ["tolist"] * 3)
    if static:
        assert reads.ops == ["aten.is_nonzero.default"]
    else:  # nonzero where sentences left the batch (and, beam > 1, where cache rows moved)
        assert reads.ops[0] == "aten.is_nonzero.default" and len(reads.ops) > 1
        assert set(reads.ops[1:]) == {"aten.nonzero.default"}
    assert len({len(t) for t in out.tokens}) > 1  # sentences left the batch at different steps
