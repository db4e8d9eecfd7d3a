"""The model: every placement runs, the slot table holds, the state_dict is placement-stable."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from runner import init as init_schemes
from runner.data.batching import collate, make_batches
from runner.data.toy import build
from runner.model.sublayer import PLACEMENTS
from runner.run.build import model_for as build_model
from tests.conftest import compose


def small_batch(cfg):
    data = build(cfg.data)
    split = data.splits["train"]
    indices = make_batches(split, 256, seed=0)[0]
    return data, collate(split, indices, data.tgt_dict.pad_index, data.tgt_dict.eos_index)


def model_for(overrides):
    cfg = compose(["model=ci", "data.toy.train_size=200", "data.toy.valid_size=20",
                   "data.toy.test_size=20", *overrides])
    data, batch = small_batch(cfg)
    torch.manual_seed(0)
    model = build_model(cfg, len(data.src_dict), len(data.tgt_dict), data.tgt_dict.pad_index)
    init_schemes.apply(model, cfg, batch)
    return cfg, model, batch


@pytest.mark.parametrize("placement, kind", list(itertools.product(
    ["post", "pre", "none", "sandwich"], ["layernorm", "rmsnorm"])))
def test_forward_backward_finite_for_every_placement(placement, kind):
    _, model, batch = model_for([f"norm={placement}", f"norm.kind={kind}"])
    logits = model(batch.src_tokens, batch.prev_tokens, batch.src_has_pad)
    assert logits.shape == (*batch.target.shape, model.output_projection_weight.shape[0])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.target.flatten(),
                                             ignore_index=model.pad_index)
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def count_norms(module):
    return sum(1 for m in module.modules() if isinstance(m, torch.nn.LayerNorm))


def test_placement_table():
    # Pre-LN: a norm before each branch plus a final norm per stack; Post-LN: one after each
    # residual add and no final norm (fairseq/models/transformer.py); none: no norm at all
    # (layer6ai-labs/T-Fixup's --dont-use-layernorm).
    _, post, _ = model_for(["norm=post"])
    _, pre, _ = model_for(["norm=pre"])
    _, none, _ = model_for(["norm=none"])
    _, sandwich, _ = model_for(["norm=sandwich"])
    n_sublayers = 2 * 2 + 2 * 3  # ci: 2 encoder layers x 2 + 2 decoder layers x 3
    assert count_norms(post) == n_sublayers
    assert isinstance(post.encoder.final_norm, torch.nn.Identity)
    assert count_norms(pre) == n_sublayers + 2
    assert isinstance(pre.encoder.final_norm, torch.nn.LayerNorm)
    assert isinstance(pre.decoder.final_norm, torch.nn.LayerNorm)
    assert count_norms(none) == 0
    assert count_norms(sandwich) == 2 * n_sublayers + 2
    for ref in post.sublayers():
        assert isinstance(ref.module.post_norm, torch.nn.LayerNorm)
        assert isinstance(ref.module.pre_norm, torch.nn.Identity)
    for ref in pre.sublayers():
        assert isinstance(ref.module.pre_norm, torch.nn.LayerNorm)
        assert isinstance(ref.module.post_norm, torch.nn.Identity)
    assert set(PLACEMENTS) == {"post", "pre", "none", "sandwich", "b2t", "resi_dual", "mix", "peri"}


def test_pre_ln_equals_the_formula():
    """x <- x + Dropout(F(LN(x))) for Pre-LN, x <- LN(x + F(x)) for Post-LN (dropout off)."""
    for placement in ("pre", "post"):
        _, model, batch = model_for([f"norm={placement}"])
        model.eval()
        ref = next(model.sublayers())
        x = torch.randn(3, 5, model.cfg.dim)
        sub = ref.module
        ln = sub.pre_norm if placement == "pre" else sub.post_norm
        got = sub(x)
        if placement == "pre":
            want = x + sub.branch(ln(x))
        else:
            want = ln(x + sub.branch(x))
        torch.testing.assert_close(got, want)


def test_residual_scales_written_in_place_take_effect():
    """Frozen omega = alpha = 1 takes the plain-add path; it must equal the general formula
    bit for bit, and a scale written in place later (an init scheme, a checkpoint) must be used."""
    _, model, _ = model_for(["norm=post"])
    model.eval()
    sub = next(model.sublayers()).module
    assert not sub.omega.requires_grad and not sub.alpha.requires_grad
    ones = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(3, 5, model.cfg.dim)
    h = sub.branch(x)
    assert torch.equal(sub(x), sub.post_norm(torch.addcmul(h * sub.alpha, x, sub.omega)))
    assert sub._unit  # the plain add was taken
    with torch.no_grad():
        sub.omega.fill_(0.5)
        sub.alpha.fill_(2.0)
    torch.testing.assert_close(sub(x), sub.post_norm(0.5 * x + 2.0 * h))
    assert not torch.allclose(sub(x), sub.post_norm(x + h), atol=1e-3)
    assert not sub._unit
    # the answer is kept between calls, so a checkpoint's in-place copy and a move to new
    # storage must each be seen
    model.load_state_dict(ones)
    assert torch.equal(sub(x), sub.post_norm(x + h)) and sub._unit
    with torch.no_grad():
        sub.omega.fill_(0.5)
    sub(x)
    model.double()
    with torch.no_grad():
        sub.omega.fill_(1.0)  # in place on the new storage: version 1 again, as before the move
    xd = x.double()
    assert torch.equal(sub(xd), sub.post_norm(xd + sub.branch(xd))) and sub._unit


def test_state_dict_keys_do_not_depend_on_residual_trainability():
    from runner.model.seq2seq import Seq2Seq
    from runner.model.sublayer import ResidualSpec

    cfg = compose(["model=ci"])
    a = Seq2Seq(cfg.model, cfg.norm, 50, 50, 1, ResidualSpec())
    b = Seq2Seq(cfg.model, cfg.norm, 50, 50, 1, ResidualSpec(omega_trainable=True, alpha_trainable=True))
    assert {k: v.shape for k, v in a.state_dict().items()} == {k: v.shape for k, v in b.state_dict().items()}
    assert not any(p.requires_grad for n, p in a.named_parameters() if n.endswith(("omega", "alpha")))
    assert all(p.requires_grad for n, p in b.named_parameters() if n.endswith(("omega", "alpha")))


@pytest.mark.parametrize("share", ["none", "decoder_io", "all"])
def test_embedding_sharing(share):
    _, model, _ = model_for([f"model.share_embeddings={share}"])
    tables = model.embedding_tables()
    assert (tables["encoder"] is tables["decoder"]) == (share == "all")
    assert (tables["decoder"] is tables["output"]) == (share in ("all", "decoder_io"))


def test_xavier_baseline_bounds():
    """The forks' default Xavier (layer6ai-labs/T-Fixup, LiyuanLucasLiu/Transformer-Clinic): q/k/v
    gain 1/sqrt(2), out/fc gain 1, zero biases, embeddings N(0, d^-1/2)."""
    _, model, _ = model_for(["model.dim=64", "model.ffn_dim=256", "model.heads=4"])
    d, f = 64, 256
    for ref in model.sublayers():
        branch = ref.module.branch
        if ref.kind == "ffn":
            assert branch.fc1.weight.abs().max() <= math.sqrt(6 / (d + f)) + 1e-7
            assert branch.fc1.weight.abs().max() > 0.9 * math.sqrt(6 / (d + f))
            assert branch.fc1.bias.abs().max() == 0
        else:
            qkv_bound = math.sqrt(6 / (2 * d)) / math.sqrt(2)
            for proj in (branch.q_proj, branch.k_proj, branch.v_proj):
                assert proj.weight.abs().max() <= qkv_bound + 1e-7
                assert proj.weight.abs().max() > 0.9 * qkv_bound
                assert proj.bias.abs().max() == 0
            assert branch.out_proj.weight.abs().max() > 0.9 * math.sqrt(6 / (2 * d)) / 1.0
    emb = model.embedding_tables()["encoder"]
    assert emb[model.pad_index].abs().sum() == 0
    assert abs(emb[4:].std().item() - d ** -0.5) < 0.1 * d ** -0.5


def test_incremental_decoding_matches_full_decoding():
    _, model, batch = model_for(["norm=pre"])
    model.eval()
    with torch.no_grad():
        memory, mask = model.encode(batch.src_tokens, batch.src_has_pad)
        full = model.decode(batch.prev_tokens, memory, mask)
        caches = [{} for _ in model.decoder.layers]
        steps = [model.decode(batch.prev_tokens[:, t:t + 1], memory, mask, caches, start=t)
                 for t in range(batch.prev_tokens.shape[1])]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-4, atol=1e-4)


def test_per_stack_placement_admin_table_1():
    """Admin Table 1 mixes a Post-LN encoder with a Pre-LN decoder."""
    _, model, batch = model_for(["norm=post", "norm.decoder_placement=pre"])
    enc = [r for r in model.sublayers() if r.side == "encoder"]
    dec = [r for r in model.sublayers() if r.side == "decoder"]
    assert all(isinstance(r.module.post_norm, torch.nn.LayerNorm) for r in enc)
    assert all(isinstance(r.module.pre_norm, torch.nn.LayerNorm) for r in dec)
    assert isinstance(model.encoder.final_norm, torch.nn.Identity)
    assert isinstance(model.decoder.final_norm, torch.nn.LayerNorm)
    assert torch.isfinite(model(batch.src_tokens, batch.prev_tokens, batch.src_has_pad)).all()
    from runner.config import ConfigError
    from runner.run.build import check_config
    with pytest.raises(ConfigError, match="use norm=post"):
        check_config(compose(["init=admin", "norm=post", "norm.decoder_placement=pre"]))


NO_DROPOUT = ["model.dropout=0", "model.attention_dropout=0", "model.activation_dropout=0"]


@pytest.mark.parametrize("overrides", [
    [],  # post-LN, fused q/k/v
    ["norm=pre", "norm.kind=rmsnorm"],
    ["init=admin"],  # trained omega: the general residual formula
    ["model.parameterization=ntk"],  # NTKLinear: separate q/k/v projections
])
def test_unpadded_training_forward_equals_the_padded_one(overrides):
    """trainer.unpad: position-wise layers on the real tokens only must give the padded
    model's logits at the real target positions, and the same gradients."""
    _, model, batch = model_for([*NO_DROPOUT, *overrides])
    pad = model.pad_index
    assert (batch.src_tokens == pad).any() and (batch.target == pad).any()  # padding on both sides
    model.train()
    padded = model(batch.src_tokens, batch.prev_tokens, batch.src_has_pad)
    keep = batch.target != pad
    assert torch.equal(batch.real_target, batch.target[keep])  # the labels of these logits
    packed = model(batch.src_tokens, batch.prev_tokens, batch.src_has_pad, unpad=True)
    assert packed.shape == (int(keep.sum()), padded.shape[-1])
    torch.testing.assert_close(packed, padded[keep], rtol=1e-5, atol=1e-5)
    weights = torch.randn_like(packed)
    params = [p for p in model.parameters() if p.requires_grad]
    reference = torch.autograd.grad((padded[keep] * weights).sum(), params)
    grads = torch.autograd.grad((packed * weights).sum(), params)
    for p, a, b in zip(params, reference, grads):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", ["key_mask", "causal", "cross"])
def test_cpu_matmul_attention_equals_sdpa(case, monkeypatch):
    """Short keys on CPU take the matmul path (kernels.CPU_MATMUL_ATTENTION_MAX_KEYS); its
    outputs and gradients must be sdpa's, masks and causal alignment included."""
    from runner.model import attention, kernels
    torch.manual_seed(0)
    attn = attention.MultiheadAttention(32, 4, dropout=0.0, self_attention=case != "cross").train()
    x = torch.randn(6, 9, 32, requires_grad=True)
    memory = torch.randn(6, 11, 32, requires_grad=True) if case == "cross" else None
    keys = 11 if case == "cross" else 9
    lengths = torch.tensor([keys, 3, 5, keys, 1, 7])
    mask = (torch.arange(keys) < lengths[:, None])[:, None, None, :] if case != "causal" else None
    sdpa_calls = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: sdpa_calls.append(1) or real_sdpa(*a, **k))
    out = attn(x, memory, attn_mask=mask, is_causal=case == "causal")
    assert not sdpa_calls  # the matmul path
    attn.kernels = kernels.AttentionKernels("cpu", max_matmul_keys=keys - 1)
    reference = attn(x, memory, attn_mask=mask, is_causal=case == "causal")
    assert len(sdpa_calls) == 1  # longer keys than the limit: sdpa
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-6)
    inputs = [x] + ([memory] if memory is not None else []) + list(attn.parameters())
    weights = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad((reference * weights).sum(), inputs),
                    torch.autograd.grad((out * weights).sum(), inputs)):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


def test_cpu_matmul_attention_dropout_is_unbiased():
    """Attention dropout on the matmul path: outputs change between draws, and their mean over
    many draws is the no-dropout output (dropout keeps the expectation)."""
    from runner.model.attention import MultiheadAttention
    torch.manual_seed(0)
    attn = MultiheadAttention(16, 2, dropout=0.3)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        clean = attn.eval()(x, is_causal=True)
        attn.train()
        draws = torch.stack([attn(x, is_causal=True) for _ in range(4000)])
    assert not torch.allclose(draws[0], draws[1])
    torch.testing.assert_close(draws.mean(0), clean, rtol=0, atol=0.03)


@pytest.mark.parametrize("path", ["matmul", "sdpa", "unpad"])
def test_an_all_true_source_mask_changes_nothing_on_a_batch_without_padding(path):
    """Compiled training passes the source mask for every batch (RunParts.src_mask_always), so a
    batch without padding must give the same logits with the mask as without it: bit for bit
    where the mask is added as zeros (CPU matmul attention, the unpadded path), within float
    rounding through sdpa."""
    cfg, model, _ = model_for([])
    data, _ = small_batch(cfg)
    split = data.splits["train"]
    by_length = {}
    for i, n in enumerate(split.src_lengths):
        by_length.setdefault(int(n), []).append(i)
    same = max(by_length.values(), key=len)[:6]  # one source length: no padding
    batch = collate(split, same, data.tgt_dict.pad_index, data.tgt_dict.eos_index)
    assert not batch.src_has_pad and len(same) == 6
    if path == "sdpa":
        model.cpu_matmul_attention_max_keys = 0
        model.select_kernels("cpu")
    model.eval()
    with torch.no_grad():
        unpad = path == "unpad"
        masked = model(batch.src_tokens, batch.prev_tokens, True, unpad=unpad)
        unmasked = model(batch.src_tokens, batch.prev_tokens, False, unpad=unpad)
    if path == "sdpa":
        torch.testing.assert_close(masked, unmasked, rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(masked, unmasked)


def test_a_learned_embedding_scale_is_one_trained_scalar_per_stack():
    """model.embed_scale_learned in translation: each stack's token embeddings get their own trained
    scalar, from sqrt(dim); the fixed sinusoids are added unscaled, so at init each stack's
    embedding equals model.embed_scale's fixed-factor one (method=dyt_embed_scale sets it with DyT)."""
    _, fixed, batch = model_for(["model.embed_scale=true"])
    _, learned, _ = model_for(["model.embed_scale=false", "model.embed_scale_learned=true"])
    scales = {k: v for k, v in learned.state_dict().items() if k.endswith("embedder.scale")}
    assert sorted(scales) == ["decoder.embedder.scale", "encoder.embedder.scale"]
    assert all(v.item() == pytest.approx(math.sqrt(fixed.cfg.dim)) for v in scales.values())
    with torch.no_grad():
        for side in ("encoder", "decoder"):
            ours, theirs = getattr(learned, side).embedder.eval(), getattr(fixed, side).embedder.eval()
            assert torch.allclose(ours(batch.src_tokens), theirs(batch.src_tokens), atol=1e-5)
