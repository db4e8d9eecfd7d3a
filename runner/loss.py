"""Label-smoothed cross entropy as the papers' forks computed it (methods 1.5)."""
from __future__ import annotations

import torch
from torch.nn import functional as F


def label_smoothed_nll(logits: torch.Tensor, target: torch.Tensor, epsilon: float,
                       pad_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed over non-pad target tokens (the caller divides by the token count).

    TFX/CLN form: loss = (1 - eps) * NLL + (eps / V) * sum_v(-log p_v); upstream fairseq's
    later eps/(V-1) normaliser is deliberately not used. Returns (loss_sum, nll_sum) in nats.
    """
    lprobs = F.log_softmax(logits.float(), dim=-1).view(-1, logits.size(-1))
    target = target.reshape(-1)
    keep = target != pad_index
    nll = -lprobs.gather(1, target.unsqueeze(1)).squeeze(1)
    smooth = -lprobs.sum(dim=-1)
    nll = nll.masked_fill(~keep, 0.0).sum()
    smooth = smooth.masked_fill(~keep, 0.0).sum()
    vocab = lprobs.size(-1)
    return (1.0 - epsilon) * nll + (epsilon / vocab) * smooth, nll
