"""Typed schemas for every config group, and the cross-field rules checked before any data loads.

Hydra merges the YAML in conf/ into these dataclasses, so an unknown key or a wrong type fails at
composition with Hydra's own message. `validate(cfg)` then checks the rules no type can express
(negative depth, warmup longer than training, an init scheme's required norm placement, ...) and
raises ConfigError with one line that names the key and what is expected.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING


class ConfigError(ValueError):
    """A user error in the configuration: reported as one line, exit code 2, no traceback."""


@dataclass
class ModelConfig:
    """Encoder-decoder Transformer (methods 1.1). `layers` sets both stacks unless
    `encoder_layers` / `decoder_layers` are given."""

    preset: str = "tiny"
    dim: int = 64
    ffn_dim: int = 128
    heads: int = 2
    layers: int = 6
    encoder_layers: Optional[int] = None
    decoder_layers: Optional[int] = None
    activation: str = "relu"  # relu | gelu
    dropout: float = 0.1  # residual dropout (fairseq --dropout)
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    # none: separate input/output matrices; decoder_io: tie decoder input and output
    # (--share-decoder-input-output-embed); all: tie encoder, decoder and output
    # (--share-all-embeddings, needs a joined dictionary). Methods 1.3.
    share_embeddings: str = "all"
    embed_scale: bool = True  # multiply token embeddings by sqrt(dim) (methods 1.3)
    # standard: the fairseq parameterization; ntk: unit-variance weights with outputs scaled by
    # 1/sqrt(fan_in) (seed 004, section "NTK parameterization").
    parameterization: str = "standard"
    # standard: logits / sqrt(head_dim); t5: no 1/sqrt(head_dim) in the logits; instead q and k
    # each get their init variance divided by sqrt(head_dim), so q.k loses a factor head_dim.
    attention: str = "standard"
    # Biases of q/k/v at init: zero (CLN) or torch_default (TFX); methods 1.4.
    qkv_bias_init: str = "zero"
    max_positions: int = 1024
    activation_checkpointing: bool = False

    @property
    def num_encoder_layers(self) -> int:
        return self.layers if self.encoder_layers is None else self.encoder_layers

    @property
    def num_decoder_layers(self) -> int:
        return self.layers if self.decoder_layers is None else self.decoder_layers


@dataclass
class NormConfig:
    """Norm placement (methods 1.2) and kind. The slot table per placement is in
    runner/model/sublayer.py."""

    placement: str = "post"  # post | pre | none | sandwich
    # Per-stack placement, null = `placement` (Admin Table 1 mixes a Post-LN encoder with a
    # Pre-LN decoder: norm.decoder_placement=pre).
    encoder_placement: Optional[str] = None
    decoder_placement: Optional[str] = None
    kind: str = "layernorm"  # layernorm | rmsnorm
    eps: float = 1e-5
    # A norm after the last layer of each stack. null: the placement's default (on for pre and
    # sandwich, off for post and none).
    final_norm: Optional[bool] = None
    # A norm on the embedding sum before the first layer: with post it gives the Lipschitz
    # paper's "v1" computation order (methods 5.2).
    embedding_norm: bool = False


@dataclass
class InitConfig:
    """Initialization scheme (runner/init/). Fields other than `name` apply to the schemes that
    read them and are ignored by the rest."""

    name: str = "xavier"
    # admin: how omega is held: vector (trainable d-vector, the reference), scalar (trainable),
    # constant (buffer). admin_torch uses the same field.
    omega: str = "vector"
    # admin_torch: O(logn) | O(1) | O(n) (methods 4.3)
    output_change_scale: str = "O(logn)"
    # lipschitz: bound = scale * sqrt(1/fan_in) (methods 5.1)
    lipschitz_scale: float = 1.0
    # ds_init: paper (l^-1/2, default) | code (l^-1/4) (methods 6)
    ds_init_form: str = "paper"
    ds_init_gain: float = 1.0
    # deepnorm: paper (0.87, default) | torchscale (1.15) (methods 7)
    deepnorm_variant: str = "paper"
    # rezero ramp: alpha rises by this step per update until 1 (seed 004); 0 = learned alpha.
    alpha_ramp_step: float = 0.0


@dataclass
class OptimConfig:
    """Optimizer (methods 9). beta1/beta2 are separate fields so a sweep can vary one."""

    name: str = "adam"  # adam | radam | sgd
    lr: float = 5e-4
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-8
    weight_decay: float = 0.0
    clip_norm: float = 0.0  # 0 disables clipping (fairseq semantics)
    momentum: float = 0.0  # sgd only
    # radam: admin (no update while rho_t < 5, decoupled decay every step), sgd_fallback
    # (SGD-momentum while rho_t < 5), torch (torch.optim.RAdam, rho_t > 5); methods 9.2.
    radam_mode: str = "admin"
    fused: Optional[bool] = None  # null: fused kernels on CUDA and CPU (AdamW, SGD)


@dataclass
class ScheduleConfig:
    """Learning-rate schedule after warmup (methods 10)."""

    name: str = "inverse_sqrt"  # inverse_sqrt | linear | constant
    # inverse_sqrt with warmup.updates = 0: lr(t) = lr * sqrt(D / (D + t)) (T-Fixup's
    # inverse_sqrt_nowarmup, TFX --decay-period 4000).
    decay_period: int = 4000
    min_lr: float = 0.0  # linear: decay to this value at trainer.max_updates


@dataclass
class WarmupConfig:
    """Linear warmup from init_lr to optim.lr over `updates` updates; 0 = no warmup."""

    updates: int = 4000
    init_lr: float = 0.0  # fairseq --warmup-init-lr (0 when unset)


@dataclass
class ToyConfig:
    """The built-in synthetic translation task (runner/data/toy.py)."""

    train_size: int = 20000
    valid_size: int = 500
    test_size: int = 500
    nouns: int = 60
    verbs: int = 30
    adjectives: int = 30
    seed: int = 1


@dataclass
class DataConfig:
    """Which corpus and how batches are formed."""

    name: str = "toy"  # toy | multi30k | iwslt14 | custom
    dir: Optional[str] = None
    source_lang: str = "de"
    target_lang: str = "en"
    train_split: str = "train"
    valid_split: str = "valid"
    test_split: str = "test"
    joined_dictionary: bool = True
    # none: text is used as it is (already tokenized/BPE'd); tokenizers: learn a BPE with
    # HuggingFace tokenizers; codes: apply subword-nmt codes from bpe_codes.
    bpe: str = "none"
    bpe_merges: int = 10000
    bpe_codes: Optional[str] = None
    lowercase: bool = False
    empty_lines: str = "skip"  # skip (counted) | error
    cache_dir: Optional[str] = None  # null: $DEEPINIT_CACHE or ~/.cache/deepinit
    max_tokens: int = 4096  # tokens per batch (the larger of source and target side, padded)
    max_source_positions: int = 1024
    max_target_positions: int = 1024
    num_workers: int = 0
    toy: ToyConfig = field(default_factory=ToyConfig)


@dataclass
class DivergenceConfig:
    """When a run is declared diverged (a result, not a crash)."""

    loss_bound: float = 20.0  # per-token loss (nats) above which an update counts as bad
    patience: int = 50  # consecutive bad updates before the run is declared diverged
    check_interval: int = 10  # updates between checks (a host sync on CUDA)
    # A finished run is "stalled" when its best valid NLL is not at least this many nats below
    # the valid targets' unigram NLL (it learned word frequencies only). A label, never a stop.
    stall_margin: float = 0.1


@dataclass
class TrainerConfig:
    max_updates: int = 1000
    max_epochs: int = 0  # 0 = no epoch limit
    update_freq: int = 1  # gradient accumulation (micro-batches per update)
    seed: int = 1
    device: str = "auto"  # auto | cpu | cuda
    devices: int = 1  # DDP processes (torchrun or submitit tasks)
    precision: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | fp32 | bf16 | fp16
    compile: bool = False
    threads: int = 0  # CPU threads; 0 = torch's default
    # training skips the padding in position-wise layers (runner/model/packing.py); null: on
    # CPU (measured faster there), off on CUDA (not measured on a GPU yet)
    unpad: Optional[bool] = None
    label_smoothing: float = 0.1
    log_interval: int = 10
    valid_interval: int = 500  # updates; 0 = only at the end
    save_interval: int = 500  # updates between checkpoints; 0 = only at the end
    keep_checkpoints: int = 1  # numbered checkpoints kept (for averaging), besides checkpoint_last
    valid_max_batches: int = 0  # 0 = the whole valid split
    resume: bool = True  # continue from checkpoint_last.pt / skip a finished run
    progress: Optional[bool] = None  # null: a live bar when the console is a terminal
    tensorboard: bool = True
    # evaluation (runner/evaluate.py, docs/evaluation.md). In-training decoding uses fairseq's
    # --eval-bleu settings (methods 2.3: beam 5, max_len_a 1.2, max_len_b 10).
    valid_bleu: bool = False  # tokenized BLEU of the valid split at every validation
    # none | loss | bleu (bleu implies valid_bleu): keep checkpoint_best.pt at the best validation
    best_checkpoint_metric: str = "none"
    final_bleu: bool = False  # decode the test split at the end of the run; BLEU into result.json
    eval_beam: int = 5
    eval_lenpen: float = 1.0
    eval_max_len_a: float = 1.2
    eval_max_len_b: int = 10
    eval_average_last: int = 10  # final_bleu: average the last K kept numbered checkpoints
    divergence: DivergenceConfig = field(default_factory=DivergenceConfig)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    norm: NormConfig = field(default_factory=NormConfig)
    init: InitConfig = field(default_factory=InitConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    # Free-form record of the sweep preset that produced this run (set by sweeps/*.yaml).
    sweep: Any = None


def register_schemas() -> None:
    """Register the schemas with Hydra's ConfigStore (called once by the CLI and the tests)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="config_schema", node=Config)


CHOICES = {
    "model.activation": ("relu", "gelu"),
    "model.share_embeddings": ("none", "decoder_io", "all"),
    "model.parameterization": ("standard", "ntk"),
    "model.attention": ("standard", "t5"),
    "model.qkv_bias_init": ("zero", "torch_default"),
    "norm.placement": ("post", "pre", "none", "sandwich"),
    "norm.kind": ("layernorm", "rmsnorm"),
    "optim.name": ("adam", "radam", "sgd"),
    "optim.radam_mode": ("admin", "sgd_fallback", "torch"),
    "schedule.name": ("inverse_sqrt", "linear", "constant"),
    "data.name": ("toy", "multi30k", "iwslt14", "custom"),
    "data.bpe": ("none", "tokenizers", "codes"),
    "data.empty_lines": ("skip", "error"),
    "trainer.device": ("auto", "cpu", "cuda"),
    "trainer.precision": ("auto", "fp32", "bf16", "fp16"),
    "trainer.best_checkpoint_metric": ("none", "loss", "bleu"),
    "init.omega": ("vector", "scalar", "constant"),
    "init.output_change_scale": ("O(logn)", "O(1)", "O(n)"),
    "init.ds_init_form": ("paper", "code"),
    "init.deepnorm_variant": ("paper", "torchscale"),
}


def _get(cfg: Any, dotted: str) -> Any:
    node = cfg
    for part in dotted.split("."):
        node = getattr(node, part) if not isinstance(node, dict) else node[part]
    return node


def validate(cfg: Any) -> None:
    """Cross-field rules. Raises ConfigError naming the offending key and what is expected."""
    for key, allowed in CHOICES.items():
        value = _get(cfg, key)
        if value not in allowed:
            raise ConfigError(f"{key}={value!r}: expected one of {', '.join(allowed)}")

    model, trainer, optim = cfg.model, cfg.trainer, cfg.optim
    positive = {
        "model.dim": model.dim,
        "model.ffn_dim": model.ffn_dim,
        "model.heads": model.heads,
        "data.max_tokens": cfg.data.max_tokens,
        "trainer.max_updates": trainer.max_updates,
        "trainer.update_freq": trainer.update_freq,
        "trainer.log_interval": trainer.log_interval,
        "trainer.devices": trainer.devices,
        "trainer.divergence.patience": trainer.divergence.patience,
        "trainer.divergence.check_interval": trainer.divergence.check_interval,
        "trainer.eval_beam": trainer.eval_beam,
    }
    for key, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{key}={value}: expected a positive integer")
    for key, explicit, value in (
        ("model.encoder_layers", model.encoder_layers, model.num_encoder_layers),
        ("model.decoder_layers", model.decoder_layers, model.num_decoder_layers),
    ):
        if value < 1:
            raise ConfigError(f"{key if explicit is not None else 'model.layers'}={value}: "
                              "expected at least 1 layer")
    if model.dim % model.heads:
        raise ConfigError(f"model.dim={model.dim} must be divisible by model.heads={model.heads}")
    for key in ("model.dropout", "model.attention_dropout", "model.activation_dropout",
                "trainer.label_smoothing"):
        value = _get(cfg, key)
        if not 0.0 <= value < 1.0:
            raise ConfigError(f"{key}={value}: expected a value in [0, 1)")
    if optim.lr <= 0:
        raise ConfigError(f"optim.lr={optim.lr}: expected a positive learning rate")
    for key in ("optim.beta1", "optim.beta2"):
        value = _get(cfg, key)
        if not 0.0 <= value < 1.0:
            raise ConfigError(f"{key}={value}: expected a value in [0, 1)")
    for key in ("optim.eps", "optim.weight_decay", "optim.clip_norm", "optim.momentum",
                "warmup.init_lr", "trainer.max_epochs", "trainer.valid_interval",
                "trainer.save_interval", "trainer.keep_checkpoints", "trainer.threads",
                "warmup.updates", "trainer.valid_max_batches", "trainer.eval_max_len_b",
                "trainer.eval_average_last", "trainer.eval_max_len_a", "trainer.eval_lenpen"):
        if _get(cfg, key) < 0:
            raise ConfigError(f"{key}={_get(cfg, key)}: expected a value >= 0")
    if trainer.save_interval % trainer.log_interval:
        raise ConfigError(
            f"trainer.save_interval={trainer.save_interval} must be a multiple of "
            f"trainer.log_interval={trainer.log_interval} (checkpoints close a log window, so a "
            "resumed run logs exactly what an uninterrupted one does)")
    if cfg.schedule.min_lr < 0:
        raise ConfigError(
            f"schedule.min_lr={cfg.schedule.min_lr}: expected >= 0 (a negative min_lr makes the "
            "linear schedule's lr negative, methods 4.5)")
    if cfg.schedule.min_lr > optim.lr:
        raise ConfigError(f"schedule.min_lr={cfg.schedule.min_lr}: expected <= optim.lr={optim.lr}")
    if cfg.schedule.decay_period <= 0:
        raise ConfigError(f"schedule.decay_period={cfg.schedule.decay_period}: expected > 0")
    if cfg.warmup.updates > trainer.max_updates:
        raise ConfigError(
            f"warmup.updates={cfg.warmup.updates} is longer than trainer.max_updates="
            f"{trainer.max_updates}: shorten the warmup or train longer")
    if cfg.warmup.init_lr > optim.lr:
        raise ConfigError(f"warmup.init_lr={cfg.warmup.init_lr}: expected <= optim.lr={optim.lr}")
    if model.share_embeddings == "all" and not cfg.data.joined_dictionary:
        raise ConfigError(
            "model.share_embeddings=all needs a joined dictionary: set data.joined_dictionary=true "
            "or model.share_embeddings=decoder_io")
    if cfg.norm.eps <= 0:
        raise ConfigError(f"norm.eps={cfg.norm.eps}: expected > 0")
    for key in ("norm.encoder_placement", "norm.decoder_placement"):
        value = _get(cfg, key)
        if value is not None and value not in CHOICES["norm.placement"]:
            raise ConfigError(f"{key}={value!r}: expected one of {', '.join(CHOICES['norm.placement'])} or null")
    if cfg.norm.placement == "none" and (cfg.norm.final_norm or cfg.norm.embedding_norm):
        raise ConfigError("norm=none removes every norm: unset norm.final_norm / norm.embedding_norm")
    if trainer.device == "cpu" and trainer.precision == "fp16":
        raise ConfigError("trainer.precision=fp16 needs CUDA: use trainer.precision=bf16 or fp32 on CPU")
    if trainer.devices > 1 and trainer.update_freq < 1:
        raise ConfigError("trainer.update_freq must be >= 1")

    # Each init scheme states what it requires (architecture principle 2).
    from runner.init import SCHEMES, scheme_requirements  # local import: init imports config

    if cfg.init.name not in SCHEMES:
        raise ConfigError(
            f"init={cfg.init.name}: unknown init scheme; expected one of {', '.join(sorted(SCHEMES))}")
    for problem in scheme_requirements(cfg):
        raise ConfigError(problem)
