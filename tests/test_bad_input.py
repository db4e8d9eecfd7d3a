"""Bad input that reaches the model trains and decodes without NaN: a source row that is all
padding (an empty sentence after filtering), a source that is only eos, and a corpus whose target
side is all unknown tokens.

A query whose keys are all masked used to get softmax over -inf only (0/0 = NaN) in the CPU
matmul and decoding kernels; the masks are now the dtype's most negative finite value
(runner/model/kernels.py), which leaves every other row bit for bit as it was.
"""
from __future__ import annotations

import math

import pytest
import torch

from runner import init as init_schemes
from runner.data.batching import collate, make_batches
from runner.data.toy import build
from runner.decode.search import beam_search, greedy_search
from runner.model import kernels
from runner.run.build import model_for as build_model
from runner.run.train import train
from tests.conftest import compose


def model_and_batch(overrides):
    cfg = compose(["model=ci", "data.toy.train_size=200", "data.toy.valid_size=20",
                   "data.toy.test_size=20", *overrides])
    data = build(cfg.data)
    split = data.splits["train"]
    batch = collate(split, make_batches(split, 256, seed=0)[0], data.tgt_dict.pad_index,
                    data.tgt_dict.eos_index)
    torch.manual_seed(0)
    model = build_model(cfg, len(data.src_dict), len(data.tgt_dict), data.tgt_dict.pad_index)
    init_schemes.apply(model, cfg, batch)
    return model, batch, data.tgt_dict


def bad_sources(src: torch.Tensor, pad: int, eos: int) -> torch.Tensor:
    """Row 0 all padding, row 1 only eos, the rest as they were."""
    src = src.clone()
    src[0] = pad
    src[1] = pad
    src[1, 0] = eos
    return src


@pytest.mark.parametrize("kernel", ["cpu", "cuda"])  # cuda: sdpa's kernels (they run on CPU too)
@pytest.mark.parametrize("unpad", [False, True])
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_empty_and_eos_only_sources_train_finite(norm, unpad, kernel):
    model, batch, d = model_and_batch([f"norm={norm}"])
    model.select_kernels(kernel).train()
    src = bad_sources(batch.src_tokens, d.pad_index, d.eos_index)
    logits = model(src, batch.prev_tokens, True, unpad=unpad)
    target = batch.target[batch.target != d.pad_index] if unpad else batch.target
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             target.reshape(-1), ignore_index=d.pad_index)
    loss.backward()
    assert torch.isfinite(logits).all() and torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_bf16_autocast_with_an_empty_source_is_finite():
    model, batch, d = model_and_batch(["norm=post"])
    model.train()
    src = bad_sources(batch.src_tokens, d.pad_index, d.eos_index)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(src, batch.prev_tokens, True)
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                             batch.target.reshape(-1), ignore_index=d.pad_index)
    loss.backward()
    assert torch.isfinite(logits.float()).all() and torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("beam", [1, 4])
def test_search_with_empty_and_eos_only_sources(beam):
    model, batch, d = model_and_batch(["norm=pre"])
    model.eval()
    src = bad_sources(batch.src_tokens[:5], d.pad_index, d.eos_index)
    if beam == 1:
        hyps = greedy_search(model, src, d.pad_index, d.bos_index, d.eos_index, max_len_b=10)
    else:
        hyps = beam_search(model, src, beam, d.pad_index, d.bos_index, d.eos_index, max_len_b=10)
    assert len(hyps.tokens) == 5
    assert all(math.isfinite(s) for s in hyps.scores), hyps.scores


def test_fully_masked_rows_are_finite_and_other_rows_unchanged():
    """Every kernel: a query with no key to attend is finite; the others equal -inf masking
    bit for bit (fp32), forward and backward."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 2, t, 8) for t in (5, 7, 7))
    mask = torch.rand(3, 1, 1, 7) > 0.4
    mask[:, ..., 0] = True
    mask[0] = False  # sentence 0: every key is padding

    def reference(q, k, v):
        scores = (q @ k.transpose(-1, -2) * 0.3).masked_fill(~mask, float("-inf"))
        return scores.softmax(-1) @ v

    def clones():
        return [t.clone().requires_grad_() for t in (q, k, v)]

    for name, run, first_query in (
        ("matmul", lambda q, k, v: kernels.matmul_attention(q, k, v, mask, 0.3), False),
        ("sdpa", lambda q, k, v: kernels.sdpa_attention(q, k, v, mask, 0.3), False),
        ("decoding", lambda q, k, v: kernels.matmul_decoding_attention(q, k, v, mask, 0.3), False),
        ("single", lambda q, k, v: kernels.single_query_decoding_attention(q[:, :, :1], k, v, mask, 0.3), True),
    ):
        leaves = clones()
        out = run(*leaves)
        out.sum().backward()
        assert torch.isfinite(out).all(), name
        assert all(torch.isfinite(t.grad).all() for t in leaves), name
        # the other rows against -inf masking, forward and backward: bit for bit on the kernel
        # the CPU golden runs use, to fp32 rounding on the others
        ref_leaves = clones()
        ref = reference(ref_leaves[0][:, :, :1] if first_query else ref_leaves[0], *ref_leaves[1:])
        ref[1:].sum().backward()
        leaves = clones()
        out = run(*leaves)
        out[1:].sum().backward()
        pairs = [(out[1:], ref[1:])] + [(t.grad[1:], r.grad[1:]) for t, r in zip(leaves, ref_leaves)]
        for got, want in pairs:
            if name == "matmul":
                assert torch.equal(got, want), name
            else:
                torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5, msg=lambda m: f"{name}: {m}")


def write_corpus(folder, target_of):
    """A small custom corpus: train/valid/test .de/.en; target_of(i, split) gives the target."""
    folder.mkdir()
    words = [f"w{i}" for i in range(30)]
    for split, n in (("train", 120), ("valid", 12), ("test", 12)):
        src = [" ".join(words[(i + j) % 30] for j in range(2 + i % 5)) for i in range(n)]
        tgt = [target_of(i, split) for i in range(n)]
        (folder / f"{split}.de").write_text("".join(s + "\n" for s in src))
        (folder / f"{split}.en").write_text("".join(t + "\n" for t in tgt))


@pytest.mark.slow
def test_corpus_with_all_unknown_target_side_trains_and_decodes(tmp_path):
    # train targets are literal <unk> tokens; valid/test targets are words never seen in training
    write_corpus(tmp_path / "corpus",
                 lambda i, split: " ".join(["<unk>"] * (1 + i % 4)) if split == "train"
                 else " ".join(f"unseen{split}{i}x{j}" for j in range(1 + i % 4)))
    cfg = compose(["model=ci", "data=custom", f"data.dir={tmp_path / 'corpus'}", "data.bpe=none",
                   f"data.cache_dir={tmp_path / 'cache'}", "warmup.updates=2",
                   "trainer.max_updates=6", "trainer.log_interval=2", "trainer.valid_interval=6",
                   "trainer.save_interval=6", "trainer.tensorboard=false", "trainer.progress=false",
                   "trainer.final_bleu=true", "trainer.eval_beam=2", "trainer.eval_average_last=1"])
    result = train(cfg, tmp_path / "run")
    assert result["status"] == "ok", result
    for key in ("train_loss", "valid_loss", "valid_nll_loss", "best_valid_loss"):
        assert math.isfinite(result[key]), (key, result[key])
    assert result["bleu"] is not None and math.isfinite(result["bleu"])
