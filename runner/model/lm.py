"""A decoder-only causal language model (GPT: karpathy/nanoGPT model.py) built from the same
stack, layers, norm slots and residual scales as the translation model, so every placement and
residual scale means the same thing in both tasks. It has one stack, on the "decoder" side: its
layers are the translation encoder's (self-attention and FFN, no cross-attention) with a causal
mask. The output projection is tied to the token table unless model.share_embeddings=none
(nanoGPT ties them: transformer.wte.weight = lm_head.weight)."""
from __future__ import annotations

from typing import Iterator

import torch
from torch import nn
from torch.nn import functional as F

from runner.config import ModelConfig, NormConfig
from runner.model.embedding import Embedder
from runner.model.seq2seq import EncoderLayer, Stack, SublayerRef, TransformerModel
from runner.model.sublayer import ResidualSpec, Slots, Sublayer, dual_scale, layer_slots, stack_slots

SIDE = "decoder"  # the one stack's side, for placements (norm.decoder_placement) and init rules


class DecoderOnlyLM(TransformerModel):
    # CPU training attention through sdpa (is_causal) at every length, not the matmul kernel the
    # translation model uses up to 128 keys: at the nanoGPT CPU shape (block 64, 4 heads of 32)
    # sdpa's causal kernel with the q/k/v gradients it returns in the layout of its inputs makes
    # a whole update ~5-10% faster (torch.profiler: the matmul kernel's gradients reach the q/k/v
    # split transposed, and its backward's cat and reshapes copied them); `deepinit bench
    # --presets lm-nanogpt-cpu --reference`, docs/lm.md.
    cpu_matmul_attention_max_keys = 0
    decoder_only = True

    def __init__(self, cfg: ModelConfig, norm: NormConfig, vocab: int, residual: ResidualSpec):
        super().__init__()
        self.cfg, self.norm_cfg = cfg, norm
        num_layers = cfg.num_decoder_layers
        per_layer = tuple(layer_slots(norm, SIDE, i, num_layers) for i in range(num_layers))

        def sublayer_factory(slots: Slots):
            def make_sublayer(branch: nn.Module) -> Sublayer:
                return Sublayer(branch, cfg.dim, slots, norm.kind, norm.eps, cfg.dropout, residual)
            return make_sublayer

        self.pad_index = None  # blocks of running text: no padding
        tokens = nn.Embedding(vocab, cfg.dim)
        self.decoder = Stack(
            Embedder(tokens, cfg.max_positions, cfg.dropout, cfg.embed_scale, cfg.fixnorm,
                     learned_positions=cfg.positions == "learned", learned_scale=cfg.embed_scale_learned),
            [EncoderLayer(cfg, sublayer_factory(slots), residual, slots, dual_scale(norm),
                          causal=True) for slots in per_layer],
            cfg.dim, stack_slots(norm, SIDE), norm, cfg.activation_checkpointing, per_layer)
        self.output_weight = (nn.Parameter(torch.empty(vocab, cfg.dim))
                              if cfg.share_embeddings == "none" else None)
        self.start_dyt(norm)

    # ----- the typed surface init schemes and analysis use (as Seq2Seq's) -----
    def sublayers(self) -> Iterator[SublayerRef]:
        for i, layer in enumerate(self.decoder.layers):
            yield SublayerRef(SIDE, i, "self_attn", layer.self_attn)
            yield SublayerRef(SIDE, i, "ffn", layer.ffn)

    def embedding_tables(self) -> dict[str, nn.Parameter]:
        """Token tables by role (tied roles are the same Parameter), and the learned position
        table under "positions" when model.positions=learned."""
        tables = {SIDE: self.decoder.embedder.tokens.weight, "output": self.output_projection_weight}
        if self.decoder.embedder.position_table is not None:
            tables["positions"] = self.decoder.embedder.position_table.weight
        return tables

    # ----- computation -----
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (B, T) with T <= model.max_positions. Returns the next-token logits (B, T, V)."""
        stack = self.decoder
        x = stack.embedding_norm(stack.embedder(tokens))
        dual = stack.start_dual(x)
        for layer in stack.layers:
            if dual is None:
                x = stack.run_layer(layer, x, None)
            else:
                x, dual = stack.run_layer(layer, x, None, None, dual)
        return F.linear(stack.output(x, dual), self.output_matrix())

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, new_tokens: int, temperature: float = 1.0,
                 top_k: int = 0, generator: torch.Generator | None = None) -> torch.Tensor:
        """Sample `new_tokens` tokens after `prompt` (B, T) (nanoGPT model.py generate): the
        context is cropped to the last max_positions tokens; logits / temperature, only the
        top_k most likely kept (0: all). temperature=0 picks the most likely token."""
        tokens = prompt
        for _ in range(new_tokens):
            context = tokens[:, -self.cfg.max_positions:]
            logits = self(context)[:, -1, :]
            if temperature == 0:
                nxt = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k:
                    kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                nxt = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
            tokens = torch.cat([tokens, nxt], dim=1)
        return tokens
