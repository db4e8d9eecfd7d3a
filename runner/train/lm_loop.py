"""The train loop of task=lm: `Trainer` with batches of running text. Updates, log windows,
divergence, validation, early stopping and checkpoints are the translation loop's own; only what
an update reads (blocks at random offsets, runner/data/lm.py) and how a batch is scored (the
next-token loss at every position) differ."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, replace

import torch

from runner.console import track
from runner.data.lm import bits_key, training_batch
from runner.model.loss import NO_PAD, label_smoothed_nll
from runner.train.loop import Trainer, Validation


@dataclass
class TextBatch:
    """`tokens` (B, T) and their next tokens `target` (B, T)."""

    tokens: torch.Tensor
    target: torch.Tensor

    @property
    def ntokens(self) -> int:
        return self.target.numel()

    def to(self, device: torch.device, non_blocking: bool = False) -> "TextBatch":
        return replace(self, tokens=self.tokens.to(device, non_blocking=non_blocking),
                       target=self.target.to(device, non_blocking=non_blocking))


class LMTrainer(Trainer):
    """Trains a runner.model.lm.DecoderOnlyLM on `parts.train_split` (an id stream)."""

    def _next_batches(self) -> tuple[list[TextBatch], int]:
        """This rank's micro-batches of the update: update u's blocks are drawn from (seed, u,
        micro-batch * world + rank), so a resumed run reads what an uninterrupted one does."""
        d, t = self.cfg.data, self.cfg.trainer
        batches = []
        for micro in range(t.update_freq):
            stream = micro * self.world + self.rank
            tokens, target = training_batch(self.parts.train_split, d.block_size, d.batch_size,
                                            t.seed, self.state.step, stream)
            batches.append(TextBatch(tokens, target).to(self.device, non_blocking=True))
        return batches, d.block_size * d.batch_size * t.update_freq * self.world

    def micro_batch_loss(self, forward, batch: TextBatch, unpad: bool):
        with self.autocast():
            logits = forward(batch.tokens)
        return label_smoothed_nll(logits, batch.target, self.cfg.trainer.label_smoothing, NO_PAD)

    @torch.no_grad()
    def validation_sums(self) -> tuple[torch.Tensor, int]:
        """This rank's summed validation loss and NLL over its share of the validation blocks."""
        self.model.eval()
        sums = torch.zeros(2, dtype=torch.float64, device=self.device)
        tokens = 0
        for tokens_cpu, target_cpu in track(self.parts.valid_batches[self.rank::self.world], "valid"):
            batch = TextBatch(tokens_cpu, target_cpu).to(self.device)
            with self.autocast():
                logits = self.model(batch.tokens)
            loss, nll = label_smoothed_nll(logits, batch.target, self.cfg.trainer.label_smoothing, NO_PAD)
            sums += torch.stack([loss, nll]).double()
            tokens += batch.ntokens
        self.model.train()
        return sums, tokens

    def validation_loss(self) -> Validation:
        """The loss, NLL and perplexity of the translation loop, and the NLL in bits (nats / ln 2)
        per token: bits per character (`bpc`) where a token is a character (data=shakespeare_char),
        bits per BPE token (`bpt`) otherwise (data=text)."""
        valid = super().validation_loss()
        return dataclasses.replace(valid, **{bits_key(self.parts.data.unit): valid.nll_loss / math.log(2.0)})
