"""The criterion, the schedules and the RAdam variants against hand computations."""
from __future__ import annotations

import math

import pytest
import torch

from runner.model.loss import label_smoothed_nll
from runner.train.optim import RAdam, build_optimizer
from runner.train.schedule import lr_at
from tests.conftest import compose


def test_label_smoothed_loss_by_hand():
    logits = torch.tensor([[[2.0, 0.5, -1.0, 0.0], [0.1, 0.2, 0.3, 0.4]]])
    target = torch.tensor([[0, 1]])  # second token is padding (pad index 1)
    eps, pad = 0.1, 1
    p = [math.exp(v) for v in (2.0, 0.5, -1.0, 0.0)]
    z = sum(p)
    logp = [math.log(v / z) for v in p]
    nll = -logp[0]
    smooth = -sum(logp)
    # the forks' form, eps / V (label_smoothed_cross_entropy.py of layer6ai-labs/T-Fixup and
    # LiyuanLucasLiu/Transformer-Clinic)
    want = (1 - eps) * nll + eps / 4 * smooth
    loss, got_nll = label_smoothed_nll(logits, target, eps, pad)
    assert loss.item() == pytest.approx(want, rel=1e-6)
    assert got_nll.item() == pytest.approx(nll, rel=1e-6)


@pytest.mark.parametrize("padded", [True, False])
def test_label_smoothed_loss_gradient_equals_autograd_of_the_formula(padded):
    """The closed-form backward against autograd through the formula itself, with padding rows
    (zero gradient) or without (unpadded training), and an upstream scale as the trainer's."""
    torch.manual_seed(0)
    eps, pad, vocab = 0.1, 1, 37
    logits = (3 * torch.randn(4, 6, vocab)).requires_grad_()
    target = torch.randint(2, vocab, (4, 6))
    if padded:
        target[0, 4:] = pad
        target[2, 1:] = pad
    loss, nll = label_smoothed_nll(logits, target, eps, pad)
    (loss * 0.37).backward()
    keep = (target != pad).double()
    logits64 = logits.detach().double().requires_grad_()
    lprobs = torch.log_softmax(logits64, -1)
    picked = lprobs.gather(-1, target[..., None]).squeeze(-1)
    want = (((1 - eps) * -picked + eps / vocab * -lprobs.sum(-1)) * keep).sum()
    assert loss.item() == pytest.approx(want.item(), rel=1e-5)
    assert nll.item() == pytest.approx((-picked * keep).sum().item(), rel=1e-5)
    (want * 0.37).backward()
    torch.testing.assert_close(logits.grad.double(), logits64.grad, rtol=1e-4, atol=1e-6)
    if padded:
        assert (logits.grad[target == pad] == 0).all()
    with pytest.raises(RuntimeError, match="twice"):
        loss2, _ = label_smoothed_nll(logits, target, eps, pad)
        loss2.backward(retain_graph=True)
        loss2.backward()


def cfg_for(overrides):
    return compose(overrides)


def test_inverse_sqrt_with_warmup():
    cfg = cfg_for(["optim.lr=5e-4", "warmup.updates=4000", "warmup.init_lr=1e-7",
                   "trainer.max_updates=100000"])
    assert lr_at(0, cfg) == pytest.approx(1e-7)
    assert lr_at(2000, cfg) == pytest.approx(1e-7 + 2000 * (5e-4 - 1e-7) / 4000)
    assert lr_at(4000, cfg) == pytest.approx(5e-4)
    assert lr_at(16000, cfg) == pytest.approx(5e-4 * math.sqrt(4000 / 16000))


def test_tfixup_inverse_sqrt_without_warmup():
    cfg = cfg_for(["optim.lr=5e-4", "warmup=none", "schedule.decay_period=4000",
                   "trainer.max_updates=100000"])
    assert lr_at(0, cfg) == pytest.approx(5e-4)  # the first update uses the full lr
    assert lr_at(4000, cfg) == pytest.approx(5e-4 / math.sqrt(2))
    assert lr_at(12000, cfg) == pytest.approx(5e-4 / 2)


def test_linear_no_warmup_admin_recipe():
    # LiyuanLucasLiu/Transformer-Clinic radam_fairseq/linear_schedule.py: update 0 at 1e-7, then
    # (LR - min)(1 - (t-1)/(T-1)) + min
    cfg = cfg_for(["optim.lr=3e-4", "schedule=linear", "schedule.min_lr=0", "warmup.updates=1",
                   "warmup.init_lr=1e-7", "trainer.max_updates=1000"])
    assert lr_at(0, cfg) == pytest.approx(1e-7)
    assert lr_at(1, cfg) == pytest.approx(3e-4)
    assert lr_at(500, cfg) == pytest.approx(3e-4 * (1 - 499 / 999))
    assert lr_at(1000, cfg) == pytest.approx(0.0, abs=1e-12)
    cfg = cfg_for(["optim.lr=3e-4", "schedule=linear", "schedule.min_lr=1e-5", "warmup=none",
                   "trainer.max_updates=100"])
    assert lr_at(0, cfg) == pytest.approx(3e-4)
    assert lr_at(50, cfg) == pytest.approx((3e-4 - 1e-5) * 0.5 + 1e-5)
    assert min(lr_at(t, cfg) for t in range(101)) >= 1e-5


def test_constant():
    cfg = cfg_for(["schedule=constant", "optim.lr=1e-3", "warmup.updates=10", "trainer.max_updates=100"])
    assert lr_at(5, cfg) == pytest.approx(5e-4)
    assert lr_at(99, cfg) == pytest.approx(1e-3)


def rho(t, beta2):
    rho_inf = 2 / (1 - beta2) - 1
    return rho_inf - 2 * t * beta2 ** t / (1 - beta2 ** t)


def test_rho_first_reaches_5_at_step_6():
    """The optimizer's rectification term is RAdam's rho_t (by the formula above), and it first
    reaches 5, where the rectified update starts, at step 6 for beta2 from 0.98 to 0.999."""
    from runner.train.optim import rectification

    for beta2 in (0.98, 0.99, 0.995, 0.999):
        assert [rectification(t, beta2)[0] for t in range(1, 20)] == pytest.approx([rho(t, beta2) for t in range(1, 20)])
        assert [t for t in range(1, 20) if rectification(t, beta2)[0] >= 5][0] == 6


def radam_trajectory(mode, steps=7, lr=0.1, wd=0.01, beta1=0.9, beta2=0.99, eps=1e-8):
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(5))
    grads = [torch.randn(5) for _ in range(steps)]
    opt = RAdam([p], lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd, mode=mode)
    start = p.detach().clone()
    out = []
    for g in grads:
        p.grad = g.clone()
        opt.step()
        out.append(p.detach().clone())
    return start, grads, out


def expected_radam(start, grads, mode, lr=0.1, wd=0.01, beta1=0.9, beta2=0.99, eps=1e-8):
    p, m, v, out = start.clone(), torch.zeros(5), torch.zeros(5), []
    rho_inf = 2 / (1 - beta2) - 1
    for t, g in enumerate(grads, start=1):
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        p = p * (1 - lr * wd)  # decoupled decay, every step
        r = rho(t, beta2)
        if r >= 5:
            rt = math.sqrt((r - 4) * (r - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * r))
            p = p - lr * rt * (m / (1 - beta1 ** t)) * math.sqrt(1 - beta2 ** t) / (v.sqrt() + eps)
        elif mode == "sgd_fallback":
            p = p - lr * m / (1 - beta1 ** t)
        out.append(p.clone())
    return out


@pytest.mark.parametrize("mode", ["admin", "sgd_fallback"])
def test_radam_variants_first_updates(mode):
    start, grads, got = radam_trajectory(mode)
    want = expected_radam(start, grads, mode)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    if mode == "admin":  # steps 1-5 only decay the weights (Transformer-Clinic radam_fairseq/radam.py)
        torch.testing.assert_close(got[4], start * (1 - 0.1 * 0.01) ** 5)


def test_torch_radam_mode_and_adam_decoupled_decay():
    cfg = compose(["optim=radam", "optim.radam_mode=torch", "optim.weight_decay=0.1"])
    p = torch.nn.Parameter(torch.ones(3))
    opt = build_optimizer([p], cfg, "cpu")
    assert isinstance(opt, torch.optim.RAdam) and opt.defaults["decoupled_weight_decay"]
    cfg = compose(["optim=adam", "optim.weight_decay=0.1", "optim.lr=0.5"])
    p = torch.nn.Parameter(torch.ones(3))
    opt = build_optimizer([p], cfg, "cpu")
    p.grad = torch.zeros(3)
    opt.step()  # zero gradient: only the decoupled decay p <- p - lr*wd*p moves the weight
    torch.testing.assert_close(p.detach(), torch.full((3,), 1 - 0.5 * 0.1))
    cfg = compose(["optim=sgd", "optim.momentum=0.9"])
    assert isinstance(build_optimizer([torch.nn.Parameter(torch.ones(1))], cfg, "cpu"), torch.optim.SGD)


def test_fused_adam_on_cpu_by_default_and_same_trajectory():
    """optim.fused null picks torch's fused CPU kernel; it must follow the unfused AdamW."""
    torch.manual_seed(0)
    grads = [torch.randn(5, 7) for _ in range(20)]
    weights = {}
    for fused in ("null", "false"):
        cfg = compose(["optim=adam", "optim.lr=1e-2", "optim.weight_decay=0.01", f"optim.fused={fused}"])
        p = torch.nn.Parameter(torch.ones(5, 7))
        opt = build_optimizer([p], cfg, "cpu")
        assert bool(opt.defaults["fused"]) == (fused == "null")
        for g in grads:
            p.grad = g.clone()
            opt.step()
        weights[fused] = p.detach()
    assert not torch.equal(weights["null"], torch.ones(5, 7))
    torch.testing.assert_close(weights["null"], weights["false"], rtol=1e-5, atol=1e-6)


def per_parameter_radam(params, grads_per_step, mode, lr=0.1, wd=0.01, beta1=0.9, beta2=0.999, eps=1e-8):
    """RAdam one parameter at a time with in-place tensor ops (the loop the optimizer ran before
    it updated lists with torch._foreach_*): the arithmetic the committed real-tier records hold."""
    from runner.train.optim import rectification
    params = [p.detach().clone() for p in params]
    state = [dict(step=0, m=torch.zeros_like(p), v=torch.zeros_like(p)) for p in params]
    for grads in grads_per_step:
        for p, g, s in zip(params, grads, state):
            if g is None:
                continue
            s["step"] += 1
            t = s["step"]
            s["m"].mul_(beta1).add_(g, alpha=1 - beta1)
            s["v"].mul_(beta2).addcmul_(g, g, value=1 - beta2)
            p.mul_(1 - lr * wd)
            rho_t, r_t = rectification(t, beta2)
            bias1 = 1 - beta1 ** t
            if rho_t >= 5:
                p.addcdiv_(s["m"], s["v"].sqrt().add_(eps), value=-(lr * r_t * math.sqrt(1 - beta2 ** t) / bias1))
            elif mode == "sgd_fallback":
                p.add_(s["m"], alpha=-lr / bias1)
    return params


@pytest.mark.parametrize("mode", ["admin", "sgd_fallback"])
def test_radam_lists_update_bit_for_bit_as_one_parameter_at_a_time(mode):
    """The list (foreach) update keeps every bit of the per-parameter one, including parameters
    whose step counts differ because they had no gradient at some updates."""
    torch.manual_seed(0)
    shapes = [(7, 3), (3,), (4, 5, 2), (1,)]
    params = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    grads_per_step = [[None if (i == 1 and t in (2, 7)) else torch.randn(s) for i, s in enumerate(shapes)]
                      for t in range(12)]  # past step 6, where rho_t first reaches 5
    want = per_parameter_radam(params, grads_per_step, mode)
    opt = RAdam(params, lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, mode=mode)
    for grads in grads_per_step:
        for p, g in zip(params, grads):
            p.grad = None if g is None else g.clone()
        opt.step()
    assert [opt.state[p]["step"] for p in params] == [12, 10, 12, 12]
    for got, expected in zip(params, want):
        assert torch.equal(got.detach(), expected)
