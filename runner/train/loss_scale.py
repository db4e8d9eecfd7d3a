"""fp16 loss scaling: the GradScaler's scale and overflow count, and when the scale has collapsed.

With trainer.precision=fp16 the loss is multiplied by a scale before backward. An update whose
gradients overflow (inf/nan) is skipped and the scale halved; every `growth_interval` updates
without overflow it doubles. A run whose gradients overflow on every update halves its scale
until it is tiny and never updates again: fairseq stops such a run ("Minimum loss scale
reached", `--min-loss-scale`, default 1e-4, fairseq/optim/dynamic_loss_scaler.py), and so does
deepinit (trainer.min_loss_scale), as a divergence with its own reason.

Everything stays on the device: reading the scale is a host sync, done only when a record is made
or divergence is checked.
"""
from __future__ import annotations

from typing import Optional

import torch


def current_scale(scaler: torch.amp.GradScaler) -> Optional[torch.Tensor]:
    """The scaler's scale as a device tensor without a host sync; the initial scale before the
    first update (the scaler creates its tensor lazily). None when the scaler is off."""
    if not scaler.is_enabled():
        return None
    if scaler._scale is not None:  # noqa: SLF001 (get_scale() would sync the host every update)
        return scaler._scale.detach().clone()
    return torch.tensor(scaler.get_scale())


def overflowed(previous_scale: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """1 when the GradScaler's scale dropped over an update (its gradients overflowed and the
    optimizer step was skipped), else 0; growth and no change are 0. On the device."""
    return (scale < previous_scale).long()


class LossScaleMonitor:
    """Counts the updates whose gradients overflowed and tells when the scale fell below
    `min_scale`. Call `before_update()` before `scaler.update()` and `after_update()` after it."""

    def __init__(self, scaler: torch.amp.GradScaler, min_scale: float):
        self.scaler, self.min_scale = scaler, min_scale
        self.overflows: Optional[torch.Tensor] = None  # device long, cumulative
        self.last_overflow: Optional[torch.Tensor] = None  # device long: 1 if the last update was skipped
        self._previous: Optional[torch.Tensor] = None

    def before_update(self) -> None:
        self._previous = current_scale(self.scaler)

    def after_update(self) -> None:
        scale = current_scale(self.scaler)
        step = overflowed(self._previous.to(scale.device), scale)
        self.last_overflow = step
        self.overflows = step if self.overflows is None else self.overflows + step

    def scale(self) -> float:
        """The current scale (a host sync)."""
        return float(self.scaler.get_scale())

    def overflow_count(self) -> int:
        """Updates so far whose gradients overflowed (a host sync)."""
        return 0 if self.overflows is None else int(self.overflows)

    def collapsed(self) -> bool:
        """The scale is below min_scale: gradients have overflowed on update after update."""
        return self.scale() < self.min_scale

    def state_dict(self) -> dict:
        return {"overflows": self.overflow_count()}

    def load_state_dict(self, state: dict) -> None:
        count = int(state.get("overflows", 0))
        self.overflows = None if count == 0 else torch.tensor(count)
