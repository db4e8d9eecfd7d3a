"""Every scheme keeps the model's structure and says what it sets: the same state_dict keys and
shapes as the baseline (a d-vector alpha where the scheme's ResidualSpec asks for one, LayerScale's),
no parameter left unset, and the changes relative to the default Xavier baseline are the ones the
scheme declares (`InitScheme.changes`, role patterns): nothing here is kept per scheme, so a new
scheme is checked from its registry line."""
from __future__ import annotations

import re
from fnmatch import fnmatch

import pytest
import torch

from runner.init import SCHEMES, residual_spec
from runner.init import apply as init_apply
from tests.init.init_helpers import initialized, make_batch, make_cfg, make_model

ALL = sorted(SCHEMES)
WEIGHTS = {f"{side}.{sub}.{p}" for side, subs in (("encoder", ("self_attn",)),
                                                  ("decoder", ("self_attn", "cross_attn")))
           for sub in subs for p in ("q", "k", "v", "out")} | {"encoder.ffn.fc1", "encoder.ffn.fc2",
                                                              "decoder.ffn.fc1", "decoder.ffn.fc2"}
OMEGAS = {"encoder.self_attn.omega", "encoder.ffn.omega", "decoder.self_attn.omega",
          "decoder.cross_attn.omega", "decoder.ffn.omega"}
ALPHAS = {"encoder.self_attn.alpha", "encoder.ffn.alpha", "decoder.self_attn.alpha",
          "decoder.cross_attn.alpha", "decoder.ffn.alpha"}
TABLES = {"embedding.encoder", "embedding.decoder", "embedding.output"}
ROLES = WEIGHTS | OMEGAS | ALPHAS | TABLES  # what InitScheme.changes may name (runner/init/base.py)


def declared_changes(scheme: str) -> set[str]:
    """The roles the scheme says it changes relative to the Xavier baseline from the same seed;
    everything else (biases, norms, the roles not named) is left at the baseline."""
    return {r for r in ROLES if any(fnmatch(r, pattern) for pattern in SCHEMES[scheme].changes)}


def test_declared_changes_name_roles():
    """Every pattern a scheme declares matches some role (a typo would declare nothing)."""
    for name, scheme in SCHEMES.items():
        for pattern in scheme.changes:
            assert any(fnmatch(r, pattern) for r in ROLES), (name, pattern)


def role(key: str) -> str:
    """state_dict key -> role, with the layer index dropped."""
    m = re.match(r"(encoder|decoder)\.layers\.\d+\.(\w+)\.branch\.(\w+)_proj\.weight$", key)
    if m:
        return f"{m[1]}.{m[2]}.{m[3]}"
    m = re.match(r"(encoder|decoder)\.layers\.\d+\.ffn\.branch\.(fc\d)\.weight$", key)
    if m:
        return f"{m[1]}.ffn.{m[2]}"
    m = re.match(r"(encoder|decoder)\.layers\.\d+\.(\w+)\.omega$", key)
    if m:
        return f"{m[1]}.{m[2]}.omega"
    m = re.match(r"(encoder|decoder)\.layers\.\d+\.(\w+)\.alpha$", key)
    if m:
        return f"{m[1]}.{m[2]}.alpha"
    m = re.match(r"(encoder|decoder)\.embedder\.tokens\.weight$", key)
    if m:
        return f"embedding.{m[1]}"
    if key == "output_weight":
        return "embedding.output"
    if key.endswith(".bias"):
        return "bias"
    return "norm"


def shapes(model) -> dict[str, tuple]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


@pytest.mark.parametrize("norm", ["post", "pre", "none"])
def test_every_scheme_keeps_keys_and_shapes(norm):
    reference = shapes(initialized(make_cfg("xavier", norm=norm, dropout=0.1))[0])
    for scheme in ALL:
        cfg = make_cfg(scheme, norm=norm, dropout=0.1)  # the scheme's options at their defaults
        model, _ = initialized(cfg)
        vector_alpha = residual_spec(cfg).alpha_vector
        expected = {k: (32,) if vector_alpha and k.endswith(".alpha") else shape
                    for k, shape in reference.items()}
        assert shapes(model) == expected, scheme


@pytest.mark.parametrize("scheme", ALL)
def test_every_parameter_is_set_and_the_changes_are_the_declared_ones(scheme):
    cfg = make_cfg(scheme, layers=2, share="none", dropout=0.1)
    # Every parameter starts as NaN: whatever the scheme does not set would stay NaN.
    model = make_model(cfg, seed=7)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    torch.manual_seed(7)
    init_apply(model, cfg, make_batch())
    for name, value in model.state_dict().items():
        assert torch.isfinite(value).all(), f"{scheme} leaves {name} unset"

    base, _ = initialized(make_cfg("xavier", layers=2, share="none", dropout=0.1), seed=7)
    model, _ = initialized(cfg, seed=7)
    base_sd = base.state_dict()
    changed = {role(k) for k, v in model.state_dict().items() if not torch.equal(v, base_sd[k])}
    assert changed == declared_changes(scheme)


def test_admin_scalar_and_constant_omega_options():
    vector, _ = initialized(make_cfg("admin"))
    scalar, _ = initialized(make_cfg("admin", omega="scalar"))
    constant, _ = initialized(make_cfg("admin", omega="constant"))
    for v, s, c in zip(vector.sublayers(), scalar.sublayers(), constant.sublayers()):
        assert v.module.omega.shape == (32,) and v.module.omega.requires_grad
        # scalar: one trainable value per sublayer (the only option that changes a shape)
        assert s.module.omega.shape == (1,) and s.module.omega.requires_grad
        assert c.module.omega.shape == (32,) and not c.module.omega.requires_grad
        assert torch.allclose(v.module.omega, s.module.omega.expand(32))
        assert torch.allclose(v.module.omega, c.module.omega)


def test_alpha_is_trained_for_rezero_and_fixed_for_the_ramp():
    rezero, _ = initialized(make_cfg("rezero", norm="none"))
    ramp, _ = initialized(make_cfg("rezero_ramp", norm="none", alpha_ramp_step=0.25))
    for a, b in zip(rezero.sublayers(), ramp.sublayers()):
        assert float(a.alpha.detach()) == 0.0 and a.alpha.requires_grad
        assert float(b.alpha) == 0.0 and not b.alpha.requires_grad


def test_rezero_shares_alpha_per_layer_and_skipinit_has_one_per_branch():
    """rztx.py: one resweight per layer; SkipInit: one alpha per residual branch. After one update
    ReZero's sublayers in a layer still agree, SkipInit's branches have moved apart."""
    for scheme, shared in (("rezero", True), ("skipinit", False)):
        model, _ = initialized(make_cfg(scheme, norm="none"))
        layer = model.decoder.layers[0]
        alphas = [layer.self_attn.alpha, layer.cross_attn.alpha, layer.ffn.alpha]
        assert all((a is alphas[0]) == shared for a in alphas[1:])
        trainable = [n for n, p in model.named_parameters() if n.endswith("alpha")]
        per_layer = len(model.encoder.layers) + len(model.decoder.layers)
        per_branch = 2 * len(model.encoder.layers) + 3 * len(model.decoder.layers)
        assert len(trainable) == (per_layer if shared else per_branch)
        torch.manual_seed(0)
        src = torch.randint(4, 40, (2, 6))
        prev = torch.randint(4, 40, (2, 5))
        model(src, prev).pow(2).mean().backward()
        with torch.no_grad():
            for a in alphas:
                a -= a.grad  # one SGD step: each alpha leaves 0 along its own gradient
        values = [float(a.detach()) for a in alphas]
        assert (max(values) - min(values) == 0.0) == shared, (scheme, values)


def test_init_embedding_writes_a_trainable_table_in_place():
    """init_embedding is called on trainable parameters: it draws N(0, d^-1/2) and zeroes the pad
    row without autograd recording the in-place writes."""
    from runner.init.common import init_embedding

    table = torch.nn.Parameter(torch.empty(50, 16))
    torch.manual_seed(0)
    init_embedding(table, 16, pad_index=1)
    assert table.requires_grad and torch.count_nonzero(table[1]) == 0
    assert table[2:].std().item() == pytest.approx(16 ** -0.5, rel=0.15)
