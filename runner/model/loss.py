"""Label-smoothed cross entropy as the papers' forks computed it
(fairseq/criterions/label_smoothed_cross_entropy.py in layer6ai-labs/T-Fixup and
LiyuanLucasLiu/Transformer-Clinic)."""
from __future__ import annotations

from typing import Optional

import torch
from torch.nn import functional as F


class _LabelSmoothedNLL(torch.autograd.Function):
    """The loss of label_smoothed_nll with its gradient in closed form: per real row,
    d loss / d logits = softmax - (1 - eps) * onehot(target) - eps / V, written into the saved
    log-probabilities. On CPU this replaces autograd's gather backward (a zero-filled (N, V)
    scatter), the sum of the two branches' gradients and log_softmax's backward: 130 -> 60 ms
    per `small` update (docs/performance.md). Backward may run once (the saved tensor is
    reused in place)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, epsilon: float,
                keep: Optional[torch.Tensor]):
        lprobs = F.log_softmax(logits, dim=-1)
        nll = -lprobs.gather(1, target[:, None]).squeeze(1)
        smooth = -lprobs.sum(dim=-1)
        if keep is not None:
            nll, smooth = nll.masked_fill(~keep, 0.0), smooth.masked_fill(~keep, 0.0)
        nll, smooth = nll.sum(), smooth.sum()
        ctx.save_for_backward(lprobs, target, keep)
        ctx.epsilon = epsilon
        ctx.mark_non_differentiable(nll)
        return (1.0 - epsilon) * nll + (epsilon / logits.shape[-1]) * smooth, nll

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, grad_nll: torch.Tensor):
        if getattr(ctx, "consumed", False):
            raise RuntimeError("label_smoothed_nll: backward through the same loss twice "
                               "is not supported")
        ctx.consumed = True
        lprobs, target, keep = ctx.saved_tensors
        eps, vocab = ctx.epsilon, lprobs.shape[-1]
        grad = lprobs.exp_().mul_(grad_loss).sub_(grad_loss * (eps / vocab))
        at_target = (grad_loss * (1.0 - eps)).expand(target.shape[0], 1)
        grad.scatter_add_(1, target[:, None], -at_target)
        if keep is not None:
            grad.masked_fill_(~keep[:, None], 0.0)
        return grad, None, None, None


NO_PAD = -1  # task=lm: no position of a block is padding; a target id the loss never sees


def label_smoothed_nll(logits: torch.Tensor, target: torch.Tensor, epsilon: float,
                       pad_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed over non-pad target tokens (the caller divides by the token count).

    The forks' form: loss = (1 - eps) * NLL + (eps / V) * sum_v(-log p_v); upstream fairseq's
    later eps/(V-1) normaliser is deliberately not used. Returns (loss_sum, nll_sum) in nats;
    nll_sum is for logging (not differentiable). `target` may be the real tokens only (as
    many rows as logits, e.g. target[target != pad] for unpadded training logits).
    """
    vocab = logits.shape[-1]
    target = target.reshape(-1)
    keep = target != pad_index
    # no mask when every row is real (unpadded training); the check reads a device value, so
    # only on CPU, where that costs no sync
    if logits.device.type == "cpu" and bool(keep.all()):
        keep = None
    return _LabelSmoothedNLL.apply(logits.float().reshape(-1, vocab), target, epsilon, keep)
