"""The schemes' numbers, checked against the papers' formulas and the reference implementations'
values, written out here (not by calling the schemes' own helpers)."""
from __future__ import annotations

import math

import pytest
import torch

from runner import init as init_schemes
from tests.init.init_helpers import initialized, make_cfg

XAVIER = lambda fi, fo, gain=1.0: gain * math.sqrt(6.0 / (fi + fo))  # noqa: E731


def layer_of(model, side, i):
    return (model.encoder if side == "encoder" else model.decoder).layers[i]


def max_abs(t):
    return float(t.detach().abs().max())



# ----- T-Fixup (Huang et al. 2020, Sec. 3.2; layer6ai-labs/T-Fixup fixup_initialization) -----

def test_tfixup_6_6_iwslt_factors_and_bounds():
    """T-Fixup's factors and bounds for 512-1024-4, 6+6 layers, as layer6ai-labs/T-Fixup
    (fixup_initialization in fairseq/modules/transformer_layer.py) scales the fairseq Xavier init."""
    enc, dec = 0.67 * 6 ** -0.25, 54 ** -0.25
    assert round(enc, 4) == 0.4281 and round(dec, 4) == 0.3689
    expected = {  # (side, sublayer, projection): Xavier bound times the T-Fixup factor
        ("encoder", "self_attn", "v_proj"): 0.0328, ("encoder", "self_attn", "out_proj"): 0.0328,
        ("encoder", "ffn", "fc1"): 0.0268, ("encoder", "ffn", "fc2"): 0.0268,
        ("decoder", "self_attn", "v_proj"): 0.0282, ("decoder", "cross_attn", "out_proj"): 0.0282,
        ("decoder", "cross_attn", "v_proj"): 0.0282, ("decoder", "ffn", "fc1"): 0.0231,
        ("decoder", "ffn", "fc2"): 0.0231, ("encoder", "self_attn", "q_proj"): 0.0541,
        ("decoder", "cross_attn", "k_proj"): 0.0541,
    }
    cfg = make_cfg("tfixup", norm="none", layers=6, dim=512, ffn_dim=1024, heads=4,
                   share="decoder_io")
    model, _ = initialized(cfg)
    for (side, sub, proj), bound in expected.items():
        for i in (0, 5):
            w = getattr(getattr(layer_of(model, side, i), sub).branch, proj).weight
            # Uniform samples of 262k+ entries reach the bound to within a fraction of a percent.
            assert max_abs(w) <= bound + 5e-5 and max_abs(w) > bound * 0.99 - 5e-5, (side, sub, proj)
    # Token tables: N(0, d^-1/2) times (9N)^-1/4, i.e. 0.3689 per entry after the sqrt(d) scale.
    for table in (model.encoder.embedder.tokens.weight, model.decoder.embedder.tokens.weight):
        rows = table[torch.arange(table.shape[0]) != 1]
        assert float(rows.detach().std() * math.sqrt(512)) == pytest.approx(0.3689, rel=0.03)
        assert float(table[1].detach().abs().sum()) == 0.0  # pad row


@pytest.mark.parametrize("share", ["none", "decoder_io", "all"])
def test_tfixup_unequal_depths_scale_each_stack_by_its_own_depth(share):
    n, m = 3, 8
    base, _ = initialized(make_cfg("xavier", norm="none", encoder_layers=n, decoder_layers=m,
                                   share=share), seed=3)
    model, _ = initialized(make_cfg("tfixup", norm="none", encoder_layers=n, decoder_layers=m,
                                    share=share), seed=3)
    enc, dec = 0.67 * n ** -0.25, (9 * m) ** -0.25
    base_sd, sd = base.state_dict(), model.state_dict()
    for key, value in sd.items():
        if "embedder" in key or key == "output_weight":
            continue
        ratio = 1.0
        if key.endswith(("v_proj.weight", "out_proj.weight", "fc1.weight", "fc2.weight")):
            ratio = enc if key.startswith("encoder") else dec
            if "v_proj" in key:
                ratio *= math.sqrt(2)
        torch.testing.assert_close(value, base_sd[key] * ratio, msg=key)
    emb_e, emb_d = (9 * n) ** -0.25, (9 * m) ** -0.25
    torch.testing.assert_close(sd["encoder.embedder.tokens.weight"],
                               base_sd["encoder.embedder.tokens.weight"] * emb_e)
    # share-all: the shared table carries only the encoder factor (layer6ai-labs/T-Fixup skips the decoder's).
    torch.testing.assert_close(sd["decoder.embedder.tokens.weight"],
                               base_sd["decoder.embedder.tokens.weight"] * (emb_e if share == "all" else emb_d))
    if share == "none":  # the separate output matrix keeps N(0, d^-1/2)
        torch.testing.assert_close(sd["output_weight"], base_sd["output_weight"])


# ----- DeepNorm (Wang et al. 2022, DeepNet: Scaling Transformers to 1,000 Layers) -----

DEEPNORM_TABLE = {  # N=M: enc alpha, enc beta, dec alpha, dec beta (xformers get_deepnorm_coefficients)
    6: (1.418, 0.497, 2.060, 0.343), 12: (1.761, 0.400, 2.449, 0.289),
    18: (1.999, 0.353, 2.711, 0.261), 100: (3.416, 0.206, 4.162, 0.170),
}


@pytest.mark.parametrize("depth", sorted(DEEPNORM_TABLE))
def test_deepnorm_constants_match_the_table(depth):
    from runner.init.deepnorm import constants

    n = m = depth
    formula = (0.81 * (n ** 4 * m) ** (1 / 16), 0.87 * (n ** 4 * m) ** (-1 / 16),
               (3 * m) ** 0.25, (12 * m) ** -0.25)
    assert [round(v, 3) for v in formula] == list(DEEPNORM_TABLE[depth])
    c = constants(n, m)
    got = (c["encoder"]["alpha"], c["encoder"]["beta"], c["decoder"]["alpha"], c["decoder"]["beta"])
    assert got == pytest.approx(formula, rel=1e-12)
    ts = constants(n, m, "torchscale")  # 1.15 instead of 0.87 on the encoder beta only
    assert ts["encoder"]["beta"] == pytest.approx(formula[1] * 1.15 / 0.87)
    assert ts["decoder"] == c["decoder"]


def test_deepnorm_model_alpha_in_omega_and_beta_gains():
    model, _ = initialized(make_cfg("deepnorm", layers=6, dim=256, ffn_dim=512, heads=4))
    ea, eb, da, db = (0.81 * 6 ** (5 / 16), 0.87 * 6 ** (-5 / 16), 18 ** 0.25, 72 ** -0.25)
    for ref in model.sublayers():
        alpha, beta = (ea, eb) if ref.side == "encoder" else (da, db)
        assert torch.allclose(ref.module.omega, torch.full_like(ref.module.omega, alpha))
        assert not ref.module.omega.requires_grad  # a constant, not trained
        branch = ref.module.branch
        projections = ({"fc1": branch.fc1, "fc2": branch.fc2} if ref.kind == "ffn" else
                       {"q": branch.q_proj, "k": branch.k_proj, "v": branch.v_proj,
                        "out": branch.out_proj})
        for role, linear in projections.items():
            fo, fi = linear.weight.shape
            gain = 1.0 if role in ("q", "k") else beta  # cross-attention v/out included
            expected_std = gain * math.sqrt(2.0 / (fi + fo))  # xavier_normal
            assert float(linear.weight.detach().std()) == pytest.approx(expected_std, rel=0.03), ref.name


# ----- admin-torch (microsoft/admin-torch, admin_torch/admin.py calculate_init) -----

def test_admin_torch_closed_form_examples():
    from runner.init.admin_torch import omega

    logn = lambda n: math.sqrt((n + 1) / math.log(n + 1) - 1)  # noqa: E731
    for n, value in {12: 2.017, 18: 2.335, 36: 3.041, 200: 6.075, 300: 7.193}.items():
        assert round(logn(n), 3) == value
        assert omega(n, "O(logn)") == pytest.approx(logn(n))
    assert round(math.sqrt(12), 3) == 3.464 and omega(12, "O(1)") == pytest.approx(3.464, abs=5e-4)
    assert omega(12, "O(n)") == 1.0


@pytest.mark.parametrize("scale", ["O(logn)", "O(1)", "O(n)"])
def test_admin_torch_model_uses_2n_encoder_3m_decoder(scale):
    model, report = initialized(make_cfg("admin_torch", encoder_layers=5, decoder_layers=4,
                                         output_change_scale=scale))
    f = {"O(logn)": lambda n: math.sqrt((n + 1) / math.log(n + 1) - 1),
         "O(1)": math.sqrt, "O(n)": lambda n: 1.0}[scale]
    for ref in model.sublayers():
        n = 10 if ref.side == "encoder" else 12  # 2*5 and 3*4
        assert float(ref.module.omega.detach().mean()) == pytest.approx(f(n), rel=1e-6)
        assert ref.module.omega.requires_grad  # default init.omega=vector: trainable d-vector
    assert report["n"] == {"encoder": 10, "decoder": 12}


def test_admin_torch_counts_2l_branches_in_a_decoder_only_lm():
    """task=lm: one stack of L layers, each a self-attention and an FFN branch, so n = 2L
    (admin-torch's num_res_layers); omega(2 * 6 = 12) = 2.017 in the O(logn) closed form."""
    from tests.model.test_lm import built, lm_config

    cfg = lm_config("post", layers=6, init="admin_torch")
    init_schemes.check_requirements(cfg)
    model = built(cfg)
    omegas = {round(float(ref.module.omega.detach().mean()), 3) for ref in model.sublayers()}
    assert omegas == {2.017}


# ----- Lipschitz (Xu et al. 2020; hfxunlp/transformer utils/init/base.py init_model_params_lipschitz) -----

def test_lipschitz_bounds_at_the_papers_sizes():
    """The scheme's bound functions at the paper's sizes give the bounds worked out by hand from
    Neutron's rules (d = 512, ffn 2,048, vocabularies 10,152 and 32,768)."""
    from runner.init.lipschitz import embedding_bound, linear_bound

    assert round(linear_bound(512, 1.0), 4) == 0.0442 and round(linear_bound(2048, 1.0), 4) == 0.0221
    assert round(linear_bound(512, 0.5), 4) == 0.0221
    assert round(embedding_bound(512, 10152), 4) == 0.0137
    assert round(embedding_bound(512, 32768), 4) == 0.0078


@pytest.mark.parametrize("share", ["all", "none"])
def test_lipschitz_bounds_per_layer(share):
    dim, ffn, vocab = 64, 256, 40
    cfg = make_cfg("lipschitz", norm="pre", layers=3, dim=dim, ffn_dim=ffn, share=share,
                   lipschitz_scale=1.0)
    model, report = initialized(cfg)
    assert report["order"] == "v2"
    for ref in model.sublayers():
        b = ref.module.branch
        linears = [b.fc1, b.fc2] if ref.kind == "ffn" else [b.q_proj, b.k_proj, b.v_proj, b.out_proj]
        for linear in linears:
            bound = math.sqrt(1.0 / linear.in_features)
            assert bound * 0.95 < max_abs(linear.weight) <= bound, ref.name
            assert float(linear.bias.detach().abs().sum()) == 0.0
    e = model.encoder.embedder.tokens.weight
    assert max_abs(e) <= math.sqrt(2 / (dim + vocab)) and max_abs(e) > 0.9 * math.sqrt(2 / (dim + vocab))
    assert float(e[1].detach().abs().sum()) == 0.0
    if share == "none":  # untied classifier: a Linear(d -> V), bound sqrt(1/d), pad row 0
        out = model.output_weight
        assert 0.9 * dim ** -0.5 < max_abs(out) <= dim ** -0.5 and float(out[1].detach().abs().sum()) == 0
    for _, norm in model.norms():
        assert torch.all(norm.weight == 1)


def test_lipschitz_scale_multiplies_the_bound():
    model, _ = initialized(make_cfg("lipschitz", norm="pre", dim=64, ffn_dim=128,
                                    lipschitz_scale=0.5))
    w = model.encoder.layers[0].ffn.branch.fc2.weight
    assert 0.95 * 0.5 / math.sqrt(128) < max_abs(w) <= 0.5 / math.sqrt(128)


# ----- DS-Init (Zhang, Titov, Sennrich, EMNLP 2019; code form: bzhangGo/zero models/transformer.py) -----

@pytest.mark.parametrize("form", ["paper", "code"])
def test_ds_init_bounds_per_layer(form):
    layers, dim, ffn = 18, 64, 128
    model, _ = initialized(make_cfg("ds_init", layers=layers, dim=dim, ffn_dim=ffn,
                                    ds_init_form=form))
    documented = {"paper": {6: 0.408, 12: 0.289, 18: 0.236}, "code": {6: 0.639, 12: 0.537, 18: 0.486}}
    power = 0.5 if form == "paper" else 0.25
    for l, value in documented[form].items():
        # 0.486 is 18^-1/4 = 0.48549 rounded up: compare to 3 decimals loosely
        assert l ** -power == pytest.approx(value, abs=1e-3)
    for ref in model.sublayers():
        l = ref.layer + 1
        b = ref.module.branch
        linears = [b.fc1, b.fc2] if ref.kind == "ffn" else [b.q_proj, b.k_proj, b.v_proj, b.out_proj]
        for linear in linears:
            fo, fi = linear.weight.shape
            bound = XAVIER(fi, fo) * l ** -power
            assert bound * 0.95 < max_abs(linear.weight) <= bound, (ref.name, form)
    # embeddings stay N(0, d^-1/2) (outside the layer scopes)
    e = model.encoder.embedder.tokens.weight
    assert float(e[2:].detach().std() * math.sqrt(dim)) == pytest.approx(1.0, rel=0.1)


def test_ds_init_gain():
    model, _ = initialized(make_cfg("ds_init", layers=4, dim=64, ffn_dim=128, ds_init_gain=0.5))
    w = model.decoder.layers[3].ffn.branch.fc1.weight
    bound = 0.5 * XAVIER(64, 128) / 2.0
    assert bound * 0.95 < max_abs(w) <= bound


# ----- T5 attention (Su 2021, kexue.fm/archives/8620, "NTK Parameterization") -----

def test_t5_attention_divides_qk_variance_by_sqrt_head_dim():
    """Su 2021 (kexue.fm/archives/8620): without 1/sqrt(d) in the logits, the q and k init
    variance is "further divided by an additional sqrt(d)" (d = the dot-product dimension, the
    head dim)."""
    std_cfg = make_cfg("xavier", dim=256, ffn_dim=256, heads=4)
    t5_cfg = make_cfg("xavier", dim=256, ffn_dim=256, heads=4)
    t5_cfg.model.attention = "t5"
    base, _ = initialized(std_cfg, seed=5)
    t5, _ = initialized(t5_cfg, seed=5)
    head_dim = 64
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        w0 = getattr(base.encoder.layers[0].self_attn.branch, name).weight
        w1 = getattr(t5.encoder.layers[0].self_attn.branch, name).weight
        expected = head_dim ** -0.5 if name in ("q_proj", "k_proj") else 1.0
        assert float(w1.detach().var() / w0.detach().var()) == pytest.approx(expected, rel=1e-5), name
    # and the logit variance at init is then about the standard one (q.k/sqrt(d) vs q.k)
    x = torch.randn(4096, 256)
    b0, b1 = base.encoder.layers[0].self_attn.branch, t5.encoder.layers[0].self_attn.branch
    with torch.no_grad():
        l0 = ((b0.q_proj(x) * b0.k_proj(x))[:, :head_dim].sum(-1) / math.sqrt(head_dim)).var()
        l1 = ((b1.q_proj(x) * b1.k_proj(x))[:, :head_dim].sum(-1)).var()
    assert float(l1 / l0) == pytest.approx(1.0, rel=1e-4)


@pytest.mark.parametrize("scheme,norm", [("lipschitz", "pre"), ("ds_init", "post"),
                                         ("deepnorm", "post"), ("tfixup", "none")])
def test_ntk_parameterization_sees_the_same_effective_weights(scheme, norm):
    """Under NTK the forward multiplies by 1/sqrt(fan_in): the stored weight times that must have
    the spread the scheme gives a standard Linear. T-Fixup scales the baseline, which under NTK is
    N(0, 1/fan_in) rather than Xavier, so only its square matrices (v/out) compare."""
    std_model, _ = initialized(make_cfg(scheme, norm=norm, dim=128, ffn_dim=256, heads=2), seed=4)
    ntk_cfg = make_cfg(scheme, norm=norm, dim=128, ffn_dim=256, heads=2)
    ntk_cfg.model.parameterization = "ntk"
    ntk_model, _ = initialized(ntk_cfg, seed=4)
    for a, b in zip(std_model.sublayers(), ntk_model.sublayers()):
        names = ("fc1", "fc2") if a.kind == "ffn" else ("v_proj", "out_proj")
        for name in (names if scheme != "tfixup" or a.kind != "ffn" else ()):
            wa = getattr(a.module.branch, name).weight.detach()
            lb = getattr(b.module.branch, name)
            wb = lb.weight.detach() * lb.output_scale
            assert float(wb.std() / wa.std()) == pytest.approx(1.0, rel=0.05), (scheme, a.name, name)
