"""The decoder-only LM (runner/model/lm.py) and what it adds for task=lm: causality under every
placement, the typed surface init schemes use, learned positions, sampling, the GPT-2 init, the
decoder-only DeepNorm constants and the cosine schedule, each against values computed here."""
from __future__ import annotations

import math

import pytest
import torch

from runner import init as init_schemes
from runner.config import Config, ConfigError
from runner.model.lm import DecoderOnlyLM
from runner.model.sublayer import norm_options_for
from runner.train.schedule import lr_at

VOCAB = 23


def lm_config(placement="pre", layers=3, init="xavier", **model) -> Config:
    cfg = Config()
    cfg.task = "lm"
    cfg.data.name = "shakespeare_char"
    cfg.model.dim, cfg.model.ffn_dim, cfg.model.heads, cfg.model.layers = 32, 64, 4, layers
    cfg.model.max_positions, cfg.model.dropout = 16, 0.0
    for key, value in model.items():
        setattr(cfg.model, key, value)
    cfg.norm = norm_options_for(placement)
    cfg.init = init_schemes.options_for(init)
    return cfg


def built(cfg: Config, seed: int = 0) -> DecoderOnlyLM:
    """The model initialized by its scheme, which may profile a first batch (init=admin)."""
    torch.manual_seed(seed)
    model = DecoderOnlyLM(cfg.model, cfg.norm, VOCAB, init_schemes.residual_spec(cfg))
    tokens = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(seed))
    init_schemes.apply(model, cfg, (tokens[:, :-1], tokens[:, 1:]))
    return model.eval()


@pytest.mark.parametrize("placement", ["post", "pre", "sandwich", "b2t", "resi_dual", "mix", "peri", "none"])
def test_no_position_sees_a_later_token(placement):
    model = built(lm_config(placement))
    tokens = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    changed = tokens.clone()
    changed[:, 7] = (changed[:, 7] + 1) % VOCAB
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert torch.equal(a[:, :7], b[:, :7])  # positions before the change are untouched
    assert not torch.allclose(a[:, 7:], b[:, 7:])  # and the change is seen from there on


def test_one_stack_of_self_attention_and_ffn_branches():
    model = built(lm_config(layers=3))
    refs = list(model.sublayers())
    assert [(r.side, r.layer, r.kind) for r in refs] == [
        ("decoder", i, kind) for i in range(3) for kind in ("self_attn", "ffn")]
    tables = model.embedding_tables()
    assert tables["decoder"] is tables["output"]  # tied, as nanoGPT ties wte and lm_head


def test_learned_positions_are_a_parameter_and_sinusoidal_ones_are_not():
    learned = built(lm_config(positions="learned"))
    fixed = built(lm_config())
    assert "decoder.embedder.position_table.weight" in learned.state_dict()
    assert not any("position" in k for k in fixed.state_dict())
    assert learned.embedding_tables()["positions"].shape == (16, 32)


@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
def test_a_learned_embedding_scale_starts_at_sqrt_dim_and_trains(positions):
    """model.embed_scale_learned: one trained scalar that starts at sqrt(dim) (DyT's LLaMA
    `shared_scale`) on the token embeddings and a learned position table, which starts at their
    scale (so the tokens' ratio to it is the unscaled model's); fixed sinusoids are added unscaled,
    as with model.embed_scale's fixed factor. The scalar gets a gradient; both factors at once is
    one line naming the key."""
    from runner.config.validate import validate

    learned = built(lm_config(embed_scale=False, embed_scale_learned=True, positions=positions))
    plain = built(lm_config(embed_scale=False, positions=positions))  # the same seed: the same tables
    fixed = built(lm_config(embed_scale=True, positions=positions))
    scale = learned.state_dict()["decoder.embedder.scale"]
    assert scale.shape == (1,) and scale.item() == pytest.approx(math.sqrt(32))
    assert not any(k.endswith("embedder.scale") for k in plain.state_dict())
    tokens = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        if positions == "learned":  # sqrt(d) * (E[token] + P[position])
            expected = math.sqrt(32) * plain.decoder.embedder(tokens)
        else:  # sqrt(d) * E[token] + PE(position): the fixed factor's output
            expected = fixed.decoder.embedder(tokens)
        assert torch.allclose(learned.decoder.embedder(tokens), expected, atol=1e-5)
        assert not torch.allclose(plain.decoder.embedder(tokens), expected, atol=1e-3)  # a real change
    learned.train()
    learned(tokens).logsumexp(-1).mean().backward()
    grad = learned.decoder.embedder.scale.grad
    assert grad is not None and grad.abs().item() > 0
    both = lm_config(embed_scale=True, embed_scale_learned=True)
    both.warmup.updates, both.data.block_size = 0, 16  # the rest of the config valid
    with pytest.raises(ConfigError, match="model.embed_scale_learned=true .* model.embed_scale=false"):
        validate(both)
    both.model.embed_scale = False
    validate(both)


def test_greedy_sampling_follows_the_forward_pass():
    model = built(lm_config())
    prompt = torch.tensor([[1, 2, 3]])
    out = model.generate(prompt, 5, temperature=0.0)
    assert out.shape == (1, 8) and torch.equal(out[:, :3], prompt)
    with torch.no_grad():
        for t in range(3, 8):
            assert out[0, t] == model(out[:, :t])[0, -1].argmax()
    top1 = model.generate(prompt, 5, temperature=1.0, top_k=1, generator=torch.Generator().manual_seed(0))
    assert torch.equal(top1, out)  # top_k=1 leaves only the most likely token


def test_gpt2_init_draws_nanogpt_stds():
    layers = 3
    model = built(lm_config(init="gpt2", layers=layers, dim=256, ffn_dim=1024, heads=4))
    residual_std = 0.02 / math.sqrt(2 * layers)  # nanoGPT model.py: 0.02/math.sqrt(2 * n_layer)
    for ref in model.sublayers():
        if ref.kind == "ffn":
            plain, writer = ref.module.branch.fc1, ref.module.branch.fc2
        else:
            plain, writer = ref.module.branch.q_proj, ref.module.branch.out_proj
        assert plain.weight.std().item() == pytest.approx(0.02, rel=0.03)
        assert writer.weight.std().item() == pytest.approx(residual_std, rel=0.03)
        assert writer.weight.mean().abs().item() < 0.1 * residual_std
        assert torch.count_nonzero(plain.bias) == 0
    assert model.embedding_tables()["decoder"].std().item() == pytest.approx(0.02, rel=0.03)


@pytest.mark.parametrize("task", ["lm", "translation"])
def test_deepnorm_uses_the_decoder_only_constants(task):
    """The model, not cfg.task, picks DeepNet's row: an LM composed under another task still gets
    the decoder-only constants (the encoder-decoder decoder's would be 1.861 and 0.380 at 4 layers)."""
    layers = 4
    cfg = lm_config("post", layers=layers, init="deepnorm", dim=256, ffn_dim=1024)
    cfg.task = task
    model = built(cfg)
    alpha, beta = (2 * layers) ** 0.25, (8 * layers) ** -0.25  # DeepNet Table 1, decoder-only row
    for ref in model.sublayers():
        assert torch.allclose(ref.module.omega, torch.full_like(ref.module.omega, alpha))
        fc2 = ref.module.branch.fc2 if ref.kind == "ffn" else ref.module.branch.v_proj
        fan_in, fan_out = fc2.weight.shape[1], fc2.weight.shape[0]
        xavier_normal_std = beta * math.sqrt(2.0 / (fan_in + fan_out))
        assert fc2.weight.std().item() == pytest.approx(xavier_normal_std, rel=0.03)


def test_lipschitz_on_a_model_without_padding_keeps_its_embedding_table():
    """A language model has no pad row (pad_index None), and weight[None] is the whole table:
    Lipschitz init, which refuses task=lm, must still not zero the table when applied directly."""
    model = built(lm_config("pre", init="lipschitz"))
    table = model.embedding_tables()["decoder"]
    assert torch.count_nonzero(table) == table.numel()
    bound = math.sqrt(2.0 / (32 + VOCAB))  # Glorot-uniform with gain sqrt(1/3): sqrt(6 / 3 / (d + V))
    assert 0.9 * bound < table.abs().max().item() <= bound


@pytest.mark.parametrize("scheme", ["tfixup", "lipschitz"])
def test_schemes_without_a_decoder_only_rule_refuse_the_task(scheme):
    cfg = lm_config("post", init=scheme)
    with pytest.raises(ConfigError) as err:
        init_schemes.check_requirements(cfg)
    message = str(err.value)
    assert message.startswith(f"init={scheme} has no rule for task=lm: ") and "\n" not in message


@pytest.mark.parametrize("scheme", sorted(init_schemes.SCHEMES))
def test_every_scheme_and_placement_trains_the_lm_2_updates_or_refuses_in_one_line(scheme):
    """Over the registry: for each placement, the config check either refuses with one line, or
    the model trains 2 AdamW updates (the scheme's own param groups and update hook) with finite
    losses and parameters. A scheme that trains under no placement refuses the task itself."""
    from runner.config.validate import validate
    from runner.model.sublayer import PLACEMENTS
    from runner.train.optim import build_optimizer

    trained, refused = [], []
    for placement in PLACEMENTS:
        cfg = lm_config(placement, layers=2, init=scheme)
        cfg.warmup.updates, cfg.data.block_size, cfg.trainer.max_updates = 0, 16, 2
        try:
            validate(cfg)
            init_schemes.check_requirements(cfg)
        except ConfigError as err:
            assert "\n" not in str(err) and str(err), (placement, err)
            refused.append(str(err))
            continue
        model = built(cfg).train()
        optimizer = build_optimizer(model.parameters(), cfg, "cpu", init_schemes.param_groups(model, cfg))
        tokens = torch.randint(0, VOCAB, (4, 16), generator=torch.Generator().manual_seed(2))
        for step in (1, 2):
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
            assert torch.isfinite(loss), (placement, loss)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            hook = init_schemes.update_hook(cfg)
            if hook is not None:
                hook(model, step)
        assert all(torch.isfinite(p).all() for p in model.parameters()), placement
        trained.append(placement)
    if not trained:
        assert all(m.startswith(f"init={scheme} has no rule for task=lm: ") for m in refused), refused


def test_cosine_schedule_is_nanogpts():
    cfg = Config()
    cfg.optim.lr, cfg.schedule.name, cfg.schedule.min_lr = 1e-3, "cosine", 1e-4
    cfg.warmup.updates, cfg.trainer.max_updates = 100, 2000

    def nanogpt(it, lr=1e-3, min_lr=1e-4, warmup=100, decay_iters=2000):
        ratio = (it - warmup) / (decay_iters - warmup)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)

    assert lr_at(50, cfg) == pytest.approx(1e-3 * 50 / 100)  # linear warmup from 0
    for step in (100, 550, 1050, 1999, 2000):
        assert lr_at(step, cfg) == pytest.approx(nanogpt(step), rel=1e-12)
    assert lr_at(1050, cfg) == pytest.approx((1e-3 + 1e-4) / 2)
    assert lr_at(2500, cfg) == pytest.approx(1e-4)  # after the decay: min_lr


def test_on_cpu_the_lm_attends_through_sdpa_and_translation_keeps_its_matmul_kernel():
    """DecoderOnlyLM runs sdpa's causal kernel at every length on CPU (faster at the nanoGPT
    shape, runner/model/lm.py); the translation model keeps matmul attention up to 128 keys.
    Both kernels compute the same logits."""
    from runner.model import kernels
    from runner.model.attention import MultiheadAttention

    model = built(lm_config(layers=2)).select_kernels("cpu")
    attention = next(m for m in model.modules() if isinstance(m, MultiheadAttention))
    assert attention.kernels.full(64) is kernels.sdpa_attention
    assert kernels.AttentionKernels("cpu").full(64) is kernels.matmul_attention  # translation's
    tokens = torch.randint(0, VOCAB, (3, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        fast = model(tokens)
        for module in model.modules():
            if isinstance(module, MultiheadAttention):
                module.kernels = kernels.AttentionKernels("cpu")
        assert torch.allclose(model(tokens), fast, atol=1e-5)


@pytest.mark.parametrize("scheme,placement,keys", [("depth_mup", "pre", ("m", "branch_multiplier", "lr_scale", "eps_scale")),
                                                   ("layerscale", "pre", ("depth", "epsilon"))])
def test_init_json_of_an_lm_reports_its_one_stack(scheme, placement, keys):
    """What a scheme reports per stack names the stacks the model has: the LM's decoder, no encoder."""
    cfg = lm_config(placement, layers=4, init=scheme)
    torch.manual_seed(0)
    model = DecoderOnlyLM(cfg.model, cfg.norm, VOCAB, init_schemes.residual_spec(cfg))
    info = init_schemes.apply(model, cfg)
    for key in keys:
        assert list(info[key]) == ["decoder"], (key, info[key])
