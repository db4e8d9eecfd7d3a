"""sigma-reparam (model.sigma_reparam, runner/model/linear.py): W_hat = gamma / sigma(W) * W with
sigma from one power-iteration step per training forward, against SVD's spectral norm; which
linears it wraps, the model at init, and an exact resume (the power-iteration vectors included)."""
from __future__ import annotations

import json

import torch
from torch.nn import functional as F

from runner.model.attention import MultiheadAttention
from runner.model.linear import SigmaReparamLinear
from runner.run.folder import LAST
from runner.run.train import train
from tests.conftest import TINY, compose
from tests.method_helpers import initialized, make_batch, make_cfg


# ----------------------------------------------------------------------------- sigma-reparam
def test_power_iteration_converges_to_the_spectral_norm():
    """From a generic start vector, one step per train-mode forward: sigma -> ||W||_2 (SVD's
    largest singular value); after_init starts at the top singular vector; eval mode does not
    advance u."""
    torch.manual_seed(0)
    lin = SigmaReparamLinear(24, 40).double()
    exact = torch.linalg.matrix_norm(lin.weight.detach(), 2)
    with torch.no_grad():
        lin.u.copy_(F.normalize(torch.randn(24, dtype=torch.float64), dim=0))
    x = torch.randn(5, 24, dtype=torch.float64)
    lin.eval()
    u_before = lin.u.clone()
    lin(x)
    assert torch.equal(lin.u, u_before)
    lin.train()
    first = float(lin.sigma().detach())
    for _ in range(200):
        lin(x)
    assert abs(first - float(exact)) > 1e-3 * float(exact)  # the start was not already converged
    torch.testing.assert_close(lin.sigma().detach(), exact, rtol=1e-6, atol=0)
    lin.after_init()
    torch.testing.assert_close(lin.gamma.detach(), exact.reshape(1), rtol=1e-10, atol=0)
    # effective weight: gamma / sigma * W has spectral norm gamma
    torch.testing.assert_close(torch.linalg.matrix_norm(lin.effective_weight().detach(), 2),
                               lin.gamma.detach()[0], rtol=1e-10, atol=0)


def test_sigma_has_no_gradient_through_the_power_iteration():
    """d/dW of sum(G * gamma W / sigma) with sigma = v^T W u and u, v constants."""
    torch.manual_seed(1)
    lin = SigmaReparamLinear(6, 5).double().train()
    with torch.no_grad():
        lin.gamma.fill_(1.7)
    W = lin.weight.detach()
    v = F.normalize(W @ lin.u, dim=0)
    u = F.normalize(W.T @ v, dim=0)
    sigma = v @ W @ u
    G = torch.randn(5, 6, dtype=torch.float64)
    (lin.effective_weight() * G).sum().backward()
    expected = 1.7 / sigma * G - 1.7 / sigma ** 2 * (G * W).sum() * torch.outer(v, u)
    torch.testing.assert_close(lin.weight.grad, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(lin.gamma.grad, ((W / sigma) * G).sum().reshape(1))
    assert not lin.u.requires_grad and "u" in lin.state_dict()


def test_sigma_reparam_wraps_the_branch_linears_only_and_draws_no_extra_random_numbers():
    initialized(make_cfg())
    plain_rng = torch.get_rng_state()
    model = initialized(make_cfg(model={"sigma_reparam": True}))
    assert torch.equal(torch.get_rng_state(), plain_rng)  # build + init drew the same numbers
    wrapped = [n for n, m in model.named_modules() if isinstance(m, SigmaReparamLinear)]
    assert len(wrapped) == 2 * (4 + 2) + 2 * (8 + 2)  # q/k/v/out (+ cross) and fc1/fc2 per layer
    assert all(n.endswith(("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2")) for n in wrapped)
    assert not any(isinstance(m, SigmaReparamLinear) for m in (model.encoder.embedder, model.decoder.embedder))


def test_sigma_reparam_equals_the_plain_model_at_init():
    """gamma_init=sigma: logits equal to the plain model's bit for bit, in eval and (the first
    forward) in train mode; gamma_init=one: every effective weight has spectral norm 1."""
    plain = initialized(make_cfg())
    # the plain model fuses q/k/v into one matmul, the reparameterized one cannot (each weight
    # has its own sigma): compare with the same computation unfused
    for m in plain.modules():
        if isinstance(m, MultiheadAttention):
            m.fuse_qkv = m.fuse_kv = False
    model = initialized(make_cfg(model={"sigma_reparam": True}))
    plain_state = plain.state_dict()
    for key, value in model.state_dict().items():
        if key in plain_state:
            assert torch.equal(value, plain_state[key]), key
    src, prev, _ = make_batch()
    with torch.no_grad():
        assert torch.equal(model.eval()(src, prev), plain.eval()(src, prev))
        assert torch.equal(model.train()(src, prev), plain.train()(src, prev))
    one = initialized(make_cfg(model={"sigma_reparam": True, "sigma_reparam_gamma_init": "one"}))
    for m in one.modules():
        if isinstance(m, SigmaReparamLinear):
            assert float(m.gamma.detach()) == 1.0
            norm = torch.linalg.matrix_norm(m.effective_weight().detach(), 2)
            assert abs(float(norm) - 1.0) < 1e-4
    with torch.no_grad():
        assert not torch.allclose(one.eval()(src, prev), plain.eval()(src, prev))


FAST = [*TINY, "trainer.save_interval=5", "trainer.log_interval=5", "trainer.valid_interval=0",
        "warmup.updates=0"]


def test_sigma_reparam_resume_is_exact(tmp_path):
    """10 updates in one go vs 5, a checkpoint (power-iteration vectors included), a fresh
    process state, 5 more: the same weights, buffers and losses. The interrupted run also
    validated at update 5 (eval mode), which must not move u."""
    args = [*FAST, "model.sigma_reparam=true", "model.dropout=0.1"]
    whole, parted = tmp_path / "whole", tmp_path / "parted"
    assert train(compose([*args, "trainer.max_updates=10"]), whole)["status"] == "ok"
    assert train(compose([*args, "trainer.max_updates=5"]), parted)["status"] == "ok"
    (parted / "result.json").unlink()  # as if killed after its checkpoint at update 5
    result = train(compose([*args, "trainer.max_updates=10"]), parted)
    assert result["resumed"] and result["updates"] == 10
    a = torch.load(whole / LAST, map_location="cpu", weights_only=True)["model"]
    b = torch.load(parted / LAST, map_location="cpu", weights_only=True)["model"]
    u_keys = [k for k in a if k.endswith(".u")]
    assert len(u_keys) == 32 and set(a) == set(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    last = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    again = [json.loads(line) for line in (parted / "metrics.jsonl").read_text().splitlines()]
    losses = [[r["loss"] for r in recs if r["split"] == "train" and r["step"] == 10] for recs in (last, again)]
    assert losses[0] == losses[1] and losses[0]
