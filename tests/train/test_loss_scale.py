"""fp16 loss scaling bookkeeping (runner/train/loss_scale.py), on CPU with torch's CPU GradScaler:
the overflow count, the min-scale stop, and that a non-finite loss under loss scaling is a skipped
update rather than a divergence. The fp16 training path itself runs in tests/test_cuda.py."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from runner.train.loop import DivergenceMonitor
from runner.train.loss_scale import LossScaleMonitor, overflowed


def test_overflowed_counts_only_a_dropped_scale():
    assert int(overflowed(torch.tensor(65536.0), torch.tensor(32768.0))) == 1
    assert int(overflowed(torch.tensor(65536.0), torch.tensor(65536.0))) == 0
    assert int(overflowed(torch.tensor(65536.0), torch.tensor(131072.0))) == 0


def _updates(scaler, monitor, poison: list[bool]) -> torch.nn.Parameter:
    """One optimizer update per entry; True makes that update's gradient inf."""
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=0.1)
    for bad in poison:
        scaler.scale(p.sum()).backward()
        if bad:
            p.grad[1] = float("inf")
        scaler.step(opt)
        monitor.before_update()
        scaler.update()
        monitor.after_update()
        opt.zero_grad(set_to_none=True)
    return p


def test_monitor_counts_overflowed_updates_and_their_steps_are_skipped():
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=1000)
    monitor = LossScaleMonitor(scaler, min_scale=1e-4)
    p = _updates(scaler, monitor, [False, True, False, True])
    assert monitor.overflow_count() == 2
    assert monitor.scale() == 2.0  # halved twice, never grown (growth_interval 1000)
    # two clean SGD steps of lr 0.1 on d(sum)/dp = 1; the overflowed ones changed nothing
    torch.testing.assert_close(p.detach(), torch.full((3,), 0.8))
    assert not monitor.collapsed()
    state = monitor.state_dict()
    fresh = LossScaleMonitor(scaler, 1e-4)
    fresh.load_state_dict(state)
    assert fresh.overflow_count() == 2


def test_divergence_is_the_scale_collapsing_not_a_skipped_nonfinite_loss():
    scaler = torch.amp.GradScaler("cpu", init_scale=1.0, growth_interval=1000)
    monitor = LossScaleMonitor(scaler, min_scale=0.1)
    trainer = SimpleNamespace(world=1, state=SimpleNamespace(step=3))
    div = DivergenceMonitor(torch.device("cpu"), 0.0, bound=20.0, patience=50, loss_scale=monitor)
    div.add(torch.tensor(float("inf")), skipped=torch.tensor(1))  # an overflow the scaler skipped
    _updates(scaler, monitor, [True, True, True])  # 1 -> 0.5 -> 0.25 -> 0.125
    assert div.check(trainer).status == "ok"
    _updates(scaler, monitor, [True])  # 0.0625 < 0.1
    outcome = div.check(trainer)
    assert outcome.status == "diverged" and outcome.diverged_step == 3
    assert "trainer.min_loss_scale=0.1" in outcome.reason and "4 updates overflowed" in outcome.reason
    # a non-finite loss whose update was applied (finite gradients) is a divergence, fp16 or not
    applied = DivergenceMonitor(torch.device("cpu"), 0.0, bound=20.0, patience=50, loss_scale=monitor)
    applied.add(torch.tensor(float("inf")), skipped=torch.tensor(0))
    assert applied.check(trainer).reason == "non-finite loss (nan/inf)"
    plain = DivergenceMonitor(torch.device("cpu"), 0.0, bound=20.0, patience=50)
    plain.add(torch.tensor(float("inf")))
    assert plain.check(trainer).reason == "non-finite loss (nan/inf)"


def test_trainer_logs_scale_and_overflows_skips_them_in_the_loss_and_resumes_the_count():
    from runner.run.build import build_run
    from runner.train.loop import Trainer, TrainWindow
    from tests.conftest import TINY, compose

    # the fp16 bookkeeping of a real Trainer, on CPU: a CPU GradScaler in place of the CUDA one
    # and a gradient hook that overflows chosen updates
    poisoned = {2, 3, 6}
    parts = build_run(compose([*TINY, "trainer.device=cpu", "model.dropout=0.0"]))
    trainer = Trainer(parts)
    trainer.scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=1000)
    trainer.loss_scale = LossScaleMonitor(trainer.scaler, min_scale=1e-4)
    weight = parts.model.encoder.layers[0].ffn.branch.fc1.weight
    current = [trainer]  # whose update the hook is in
    weight.register_hook(lambda g: g * float("inf") if current[0].state.step + 1 in poisoned else g)
    window = TrainWindow(trainer.device)
    outs = [trainer.step() for _ in range(4)]
    for out in outs:
        window.add(out)
    assert [int(o.skipped) for o in outs] == [0, 1, 1, 0]
    record = window.record(trainer, 1e-3)
    assert record["loss_scale"] == 64.0 and record["overflows"] == 2
    kept = [o for o in outs if int(o.skipped) == 0]  # the window's loss covers the trained updates
    expected = sum(float(o.loss_sum) for o in kept) / sum(o.tokens for o in kept)
    assert record["loss"] == pytest.approx(expected, rel=1e-6)
    state = trainer.state_dict()
    resumed = Trainer(parts)
    resumed.scaler = torch.amp.GradScaler("cpu", init_scale=1.0, growth_interval=1000)
    resumed.loss_scale = LossScaleMonitor(resumed.scaler, min_scale=1e-4)
    resumed.load_state_dict(state)
    current[0] = resumed
    assert resumed.loss_scale.overflow_count() == 2 and resumed.loss_scale.scale() == 64.0
    for _ in range(2):  # updates 5 and 6; 6 overflows
        resumed.step()
    assert resumed.loss_scale.overflow_count() == 3 and resumed.loss_scale.scale() == 32.0
