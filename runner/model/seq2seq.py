"""The fairseq-style encoder-decoder Transformer (facebookresearch/fairseq,
fairseq/models/transformer.py) with norm slots and residual scales that every placement and init
scheme shares."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from runner.config import ModelConfig, NormConfig
from runner.model.attention import MultiheadAttention, attention_options
from runner.model.embedding import Embedder
from runner.model.ffn import FeedForward
from runner.model.kernels import CPU_MATMUL_ATTENTION_MAX_KEYS, AttentionKernels
from runner.model.linear import SigmaReparamLinear, linear_variant
from runner.model.norms import NORM_TYPES, DynamicTanh, make_norm
from runner.model.packing import Packing
from runner.model.sublayer import (
    RESI_DUAL_FINAL_EPS,
    DualStream,
    ResiDualOutput,
    ResidualSpec,
    Slots,
    Sublayer,
    dual_scale,
    layer_slots,
    stack_slots,
)


@dataclass
class SublayerRef:
    """A typed handle on one residual branch, for init schemes and analysis hooks."""

    side: str  # encoder | decoder
    layer: int  # 0-based index within its stack
    kind: str  # self_attn | cross_attn | ffn
    module: Sublayer  # .branch is MultiheadAttention (q/k/v/out_proj) or FeedForward (fc1/fc2)

    @property
    def alpha(self) -> nn.Parameter:
        """The branch scale (the same Parameter for a layer's sublayers when shared)."""
        return self.module.alpha

    @property
    def name(self) -> str:
        return f"{self.side}.{self.layer}.{self.kind}"


def share_alpha(sublayers: list[Sublayer], residual: ResidualSpec) -> None:
    """ReZero's one alpha per layer (rztx.py): the sublayers hold the same Parameter, so the
    state_dict keys are those of per-branch alpha (SkipInit) and schemes stay interchangeable."""
    if residual.alpha_per_layer:
        for sub in sublayers[1:]:
            sub.alpha = sublayers[0].alpha


class EncoderLayer(nn.Module):
    """Self-attention and FFN; with causal=True (a decoder-only LM's layer) query i attends keys
    0..i."""

    def __init__(self, cfg: ModelConfig, make_sublayer, residual: ResidualSpec,
                 slots: Optional[Slots] = None, dual_scale: float = 1.0, causal: bool = False):
        super().__init__()
        self.causal = causal
        self.self_attn = make_sublayer(MultiheadAttention(
            cfg.dim, cfg.heads, cfg.attention_dropout, cfg.parameterization, cfg.attention,
            **attention_options(cfg)))
        self.ffn = make_sublayer(FeedForward(cfg.dim, cfg.ffn_dim, cfg.activation,
                                             cfg.activation_dropout, cfg.parameterization,
                                             linear_variant(cfg)))
        share_alpha([self.self_attn, self.ffn], residual)
        # B2T: x (the layer input) joins the FFN's post-norm; ResiDual: s of the dual stream
        self.bottom_to_top = slots is not None and slots.bottom_to_top
        self.dual_scale = dual_scale

    def forward(self, x: torch.Tensor, pad_mask: Optional[torch.Tensor],
                packing: Optional[Packing] = None, dual: Optional[torch.Tensor] = None):
        """Returns the layer output; with `dual` (ResiDual) the pair (output, dual stream)."""
        bottom = x if self.bottom_to_top else None
        stream = None if dual is None else DualStream(dual, self.dual_scale)
        x = self.self_attn(x, attn_mask=pad_mask, is_causal=self.causal, packing=packing, dual=stream)
        if bottom is None and stream is None:
            return self.ffn(x)
        x = self.ffn(x, bottom=bottom, dual=stream)
        return x if stream is None else (x, stream.value)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, make_sublayer, residual: ResidualSpec,
                 slots: Optional[Slots] = None, dual_scale: float = 1.0):
        super().__init__()
        self.self_attn = make_sublayer(MultiheadAttention(
            cfg.dim, cfg.heads, cfg.attention_dropout, cfg.parameterization, cfg.attention,
            **attention_options(cfg)))
        self.cross_attn = make_sublayer(MultiheadAttention(
            cfg.dim, cfg.heads, cfg.attention_dropout, cfg.parameterization, cfg.attention,
            self_attention=False, **attention_options(cfg)))
        self.ffn = make_sublayer(FeedForward(cfg.dim, cfg.ffn_dim, cfg.activation,
                                             cfg.activation_dropout, cfg.parameterization,
                                             linear_variant(cfg)))
        share_alpha([self.self_attn, self.cross_attn, self.ffn], residual)
        # B2T: x (the layer input, before self-attention) joins the FFN's post-norm, whose
        # branch input h is the cross-attention sublayer's output; ResiDual: s of the dual stream
        self.bottom_to_top = slots is not None and slots.bottom_to_top
        self.dual_scale = dual_scale

    def forward(self, x: torch.Tensor, memory: torch.Tensor, memory_mask: Optional[torch.Tensor],
                cache: Optional[dict] = None, packing: Optional[Packing] = None,
                memory_packing: Optional[Packing] = None, dual: Optional[torch.Tensor] = None):
        """Returns the layer output; with `dual` (ResiDual) the pair (output, dual stream)."""
        bottom = x if self.bottom_to_top else None
        stream = None if dual is None else DualStream(dual, self.dual_scale)
        # Training: causal mask only. Targets are right-padded, so a real token never sees a pad
        # key, and sdpa can use its flash kernel. Incremental decoding: one query, no mask.
        x = self.self_attn(x, is_causal=cache is None, packing=packing, dual=stream,
                           cache=None if cache is None else cache.setdefault("self", {}))
        x = self.cross_attn(x, memory=memory, attn_mask=memory_mask, packing=packing,
                            memory_packing=memory_packing, dual=stream,
                            cache=None if cache is None else cache.setdefault("cross", {}))
        if bottom is None and stream is None:
            return self.ffn(x)
        x = self.ffn(x, bottom=bottom, dual=stream)
        return x if stream is None else (x, stream.value)


class Stack(nn.Module):
    """Embedding -> optional embedding norm -> layers -> optional final norm. `slots` are the
    stack-level slots (final_norm, embedding_norm, dual); `per_layer` the slots each layer was
    built with (one placement per layer: Mix-LN's differ between layers)."""

    def __init__(self, embedder: Embedder, layers: list[nn.Module], dim: int, slots: Slots,
                 norm: NormConfig, checkpointing: bool, per_layer: tuple[Slots, ...] = ()):
        super().__init__()
        self.embedder = embedder
        embedding_norm = norm.embedding_norm or slots.embedding_norm  # Peri-LN's is a slot
        self.embedding_norm = make_norm(norm.kind, dim, norm.eps) if embedding_norm else nn.Identity()
        self.layers = nn.ModuleList(layers)
        self.layer_slots = tuple(per_layer) or (slots,) * len(layers)
        final = slots.final_norm if norm.final_norm is None else norm.final_norm
        # ResiDual's LN(d_N) has eps 1e-7 (microsoft/ResiDual resi_dual.py: LayerNorm(..., eps=1e-7))
        final_eps = RESI_DUAL_FINAL_EPS if slots.dual else norm.eps
        self.final_norm = make_norm(norm.kind, dim, final_eps) if final else nn.Identity()
        self.checkpointing = checkpointing
        # trainer.compile_scope=layers: each layer's compiled call, by the layer's id, used in
        # training only (compile_layers); a plain dict, so no compiled wrapper enters the state dict
        self.compiled_calls: dict[int, Callable] = {}
        # ResiDual: d_0 = s x_0 and the output alpha x_N + final_norm(d_N); None otherwise
        self.dual = (ResiDualOutput(norm.resi_dual_scale, norm.resi_dual_alpha)
                     if slots.dual else None)

    def start_dual(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        """ResiDual's d_0 = s * x_0 (microsoft/ResiDual resi_dual.py: res = x * res_input_norm_scale);
        None when the stack has no dual stream."""
        return None if self.dual is None else x * self.dual.scale

    def output(self, x: torch.Tensor, dual: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The stack's output: final_norm(x), or ResiDual's alpha * x_N + final_norm(d_N)."""
        if dual is None:
            return self.final_norm(x)
        return self.dual(x, self.final_norm(dual))

    def compile_layers(self, compile_layer: Callable[[nn.Module], Callable]) -> None:
        """Training calls each layer through compile_layer(layer) (torch.compile of that layer);
        validation, decoding and a train-mode forward without gradients (an analysis's, as
        `deepinit analyze mode-gap` takes) call the layers themselves."""
        self.compiled_calls = {id(layer): compile_layer(layer) for layer in self.layers}

    def run_layer(self, layer: nn.Module, *args):
        if self.compiled_calls and self.training and torch.is_grad_enabled():
            layer = self.compiled_calls.get(id(layer), layer)
        if self.checkpointing and self.training:
            return checkpoint(layer, *args, use_reentrant=False)
        return layer(*args)


class TransformerModel(nn.Module):
    """What the translation model and the decoder-only LM (runner/model/lm.py) share: the
    output projection (tied to the decoder's token table unless `output_weight` is set), kernel
    selection, weight-dependent state after init, and the norms, for init schemes and analysis."""

    decoder: "Stack"
    output_weight: Optional[nn.Parameter]
    cfg: ModelConfig
    decoder_only = False  # runner.model.lm.DecoderOnlyLM: True (init rules differ: DeepNet's Table 1)

    def start_dyt(self, norm: NormConfig) -> None:
        """DyT's alpha starts at norm.dyt_alpha in every DyT the model holds (its reset value too)."""
        for module in self.modules():
            if isinstance(module, DynamicTanh):
                module.alpha_init = norm.dyt_alpha
                module.reset_parameters()

    @property
    def output_projection_weight(self) -> torch.Tensor:
        return self.decoder.embedder.tokens.weight if self.output_weight is None else self.output_weight

    def output_matrix(self) -> torch.Tensor:
        """The matrix the logits use: the output projection, its rows at unit length under
        model.fixnorm (tnq177/transformers_without_tears model.py: logit_fn on the
        F.normalize'd word_embedding)."""
        weight = self.output_projection_weight
        return F.normalize(weight, dim=-1) if self.cfg.fixnorm else weight

    # CPU training attention runs as plain matmuls up to this many keys, sdpa beyond
    # (runner/model/kernels.py); a model class may choose otherwise (DecoderOnlyLM: sdpa always)
    cpu_matmul_attention_max_keys = CPU_MATMUL_ATTENTION_MAX_KEYS

    def select_kernels(self, device_type: str) -> "TransformerModel":
        """Choose every attention's kernels for the device the model now lives on (call after
        .to(device); runner/model/kernels.py)."""
        chosen = AttentionKernels(device_type, self.cpu_matmul_attention_max_keys)
        for module in self.modules():
            if isinstance(module, MultiheadAttention):
                module.kernels = chosen
        return self

    def compile_layers(self, compile_layer: Callable[[nn.Module], Callable]) -> None:
        """trainer.compile_scope=layers: training calls every layer of every stack through
        compile_layer(layer) (Stack.compile_layers)."""
        for module in self.modules():
            if isinstance(module, Stack):
                module.compile_layers(compile_layer)

    @torch.no_grad()
    def after_init(self) -> None:
        """Set what depends on the initial weights, once the init scheme has written them
        (runner.init.apply calls it): sigma-reparam's power-iteration vectors and gamma
        (runner/model/linear.py SigmaReparamLinear.after_init). Draws no random numbers; a no-op
        without sigma-reparam."""
        for module in self.modules():
            if isinstance(module, SigmaReparamLinear):
                module.after_init()

    def norms(self) -> Iterator[tuple[str, nn.Module]]:
        for name, module in self.named_modules():
            if isinstance(module, NORM_TYPES) or type(module).__name__ == "RMSNorm":
                yield name, module



class Seq2Seq(TransformerModel):
    def __init__(self, cfg: ModelConfig, norm: NormConfig, src_vocab: int, tgt_vocab: int,
                 pad_index: int, residual: ResidualSpec):
        super().__init__()
        self.cfg, self.norm_cfg, self.pad_index = cfg, norm, pad_index
        enc_layers, dec_layers = cfg.num_encoder_layers, cfg.num_decoder_layers
        enc_slots = tuple(layer_slots(norm, "encoder", i, enc_layers) for i in range(enc_layers))
        dec_slots = tuple(layer_slots(norm, "decoder", i, dec_layers) for i in range(dec_layers))

        def sublayer_factory(slots: Slots):
            def make_sublayer(branch: nn.Module) -> Sublayer:
                return Sublayer(branch, cfg.dim, slots, norm.kind, norm.eps, cfg.dropout, residual)
            return make_sublayer

        src_embed = nn.Embedding(src_vocab, cfg.dim, padding_idx=pad_index)
        if cfg.share_embeddings == "all":
            if src_vocab != tgt_vocab:
                raise ValueError("share_embeddings=all needs one joined vocabulary")
            tgt_embed = src_embed
        else:
            tgt_embed = nn.Embedding(tgt_vocab, cfg.dim, padding_idx=pad_index)
        self.encoder = Stack(
            Embedder(src_embed, cfg.max_positions, cfg.dropout, cfg.embed_scale, cfg.fixnorm,
                     learned_scale=cfg.embed_scale_learned),
            [EncoderLayer(cfg, sublayer_factory(slots), residual, slots, dual_scale(norm))
             for slots in enc_slots],
            cfg.dim, stack_slots(norm, "encoder"), norm, cfg.activation_checkpointing, enc_slots)
        self.decoder = Stack(
            Embedder(tgt_embed, cfg.max_positions, cfg.dropout, cfg.embed_scale, cfg.fixnorm,
                     learned_scale=cfg.embed_scale_learned),
            [DecoderLayer(cfg, sublayer_factory(slots), residual, slots, dual_scale(norm))
             for slots in dec_slots],
            cfg.dim, stack_slots(norm, "decoder"), norm, cfg.activation_checkpointing, dec_slots)
        # Output projection: tied to the decoder embedding unless share_embeddings=none.
        self.output_weight = (nn.Parameter(torch.empty(tgt_vocab, cfg.dim))
                              if cfg.share_embeddings == "none" else None)
        self.start_dyt(norm)

    # ----- typed surface for init schemes and analysis (by role, never by parameter name) -----
    def sublayers(self) -> Iterator[SublayerRef]:
        """Every residual branch in forward order: encoder layers, then decoder layers."""
        for i, layer in enumerate(self.encoder.layers):
            yield SublayerRef("encoder", i, "self_attn", layer.self_attn)
            yield SublayerRef("encoder", i, "ffn", layer.ffn)
        for i, layer in enumerate(self.decoder.layers):
            yield SublayerRef("decoder", i, "self_attn", layer.self_attn)
            yield SublayerRef("decoder", i, "cross_attn", layer.cross_attn)
            yield SublayerRef("decoder", i, "ffn", layer.ffn)

    def embedding_tables(self) -> dict[str, nn.Parameter]:
        """Token tables by role; tied roles are the same Parameter object."""
        return {
            "encoder": self.encoder.embedder.tokens.weight,
            "decoder": self.decoder.embedder.tokens.weight,
            "output": self.output_projection_weight,
        }

    # ----- computation -----
    def encode(self, src_tokens: torch.Tensor, src_has_pad: bool = True):
        """src_tokens: (B, S), right-padded. Returns memory (B, S, D) and the key mask
        (B, 1, 1, S), True where a real token is (None when the batch has no padding)."""
        mask = (src_tokens != self.pad_index)[:, None, None, :] if src_has_pad else None
        x = self.encoder.embedding_norm(self.encoder.embedder(src_tokens))
        dual = self.encoder.start_dual(x)
        for layer in self.encoder.layers:
            if dual is None:
                x = self.encoder.run_layer(layer, x, mask)
            else:
                x, dual = self.encoder.run_layer(layer, x, mask, None, dual)
        return self.encoder.output(x, dual), mask

    def decode(self, prev_tokens: torch.Tensor, memory: torch.Tensor,
               memory_mask: Optional[torch.Tensor], caches: Optional[list[dict]] = None,
               start: int = 0) -> torch.Tensor:
        """prev_tokens: (B, T) decoder input (eos-shifted target). Returns logits (B, T, V).
        With `caches` (one dict per layer) only the new positions are fed (from `start`)."""
        x = self.decoder.embedding_norm(self.decoder.embedder(prev_tokens, start))
        dual = self.decoder.start_dual(x)
        if dual is not None:  # ResiDual: the dual stream is position-wise, caches need nothing
            for i, layer in enumerate(self.decoder.layers):
                if caches is None:
                    x, dual = self.decoder.run_layer(layer, x, memory, memory_mask, None, None,
                                                     None, dual)
                else:
                    x, dual = layer(x, memory, memory_mask, caches[i], dual=dual)
            return F.linear(self.decoder.output(x, dual), self.output_matrix())
        for i, layer in enumerate(self.decoder.layers):
            if caches is None:
                x = self.decoder.run_layer(layer, x, memory, memory_mask)
            else:
                x = layer(x, memory, memory_mask, caches[i])
        return F.linear(self.decoder.final_norm(x), self.output_matrix())

    def forward(self, src_tokens: torch.Tensor, prev_tokens: torch.Tensor,
                src_has_pad: bool = True, unpad: bool = False) -> torch.Tensor:
        """Logits (B, T, V); with unpad=True (training) the logits of the real target
        positions only, (N, V) in row-major order: those of target[target != pad]."""
        if unpad:
            return self._forward_unpadded(src_tokens, prev_tokens, src_has_pad)
        memory, mask = self.encode(src_tokens, src_has_pad)
        return self.decode(prev_tokens, memory, mask)

    def _forward_unpadded(self, src_tokens: torch.Tensor, prev_tokens: torch.Tensor,
                          src_has_pad: bool) -> torch.Tensor:
        """The same computation on the real tokens (runner/model/packing.py); prev_tokens is
        padded where the target is (eos + target[:-1])."""
        src_keep = src_tokens != self.pad_index
        mask = src_keep[:, None, None, :] if src_has_pad else None
        src, tgt = Packing(src_keep), Packing(prev_tokens != self.pad_index)
        x = src.pack(self.encoder.embedding_norm(self.encoder.embedder(src_tokens)))
        dual = self.encoder.start_dual(x)
        for layer in self.encoder.layers:
            if dual is None:
                x = self.encoder.run_layer(layer, x, mask, src)
            else:
                x, dual = self.encoder.run_layer(layer, x, mask, src, dual)
        memory = self.encoder.output(x, dual)
        y = tgt.pack(self.decoder.embedding_norm(self.decoder.embedder(prev_tokens)))
        dual = self.decoder.start_dual(y)
        for layer in self.decoder.layers:
            if dual is None:
                y = self.decoder.run_layer(layer, y, memory, mask, None, tgt, src)
            else:
                y, dual = self.decoder.run_layer(layer, y, memory, mask, None, tgt, src, dual)
        return F.linear(self.decoder.output(y, dual), self.output_matrix())


def build_model(cfg, src_vocab: int, tgt_vocab: int, pad_index: int,
                residual: ResidualSpec) -> Seq2Seq:
    """Build from the full config. `residual` says which residual scales train: the init
    scheme declares it, and the run assembly passes it in (the model never imports init)."""
    return Seq2Seq(cfg.model, cfg.norm, src_vocab, tgt_vocab, pad_index, residual)
