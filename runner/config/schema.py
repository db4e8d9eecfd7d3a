"""Typed schemas for every config group.

The CLI merges the YAML in conf/ into these dataclasses, so an unknown key or a wrong type fails
at composition. Rules no type can express are in runner/config/validate.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from runner.config.options import options


@dataclass
class ModelConfig:
    """Encoder-decoder Transformer (fairseq's transformer_iwslt_de_en / base_architecture).
    `layers` sets both stacks unless `encoder_layers` / `decoder_layers` are given."""

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
    # (--share-all-embeddings, needs a joined dictionary).
    share_embeddings: str = "all"
    embed_scale: bool = True  # multiply token embeddings by sqrt(dim) (fairseq's embed_scale)
    # a trained scalar that starts at sqrt(dim) in place of embed_scale's fixed factor, on the tokens
    # and on learned positions (sinusoids are added unscaled) (DyT's LLaMA:
    # jiachenzhu/DyT other_tasks/LLaMA/fms_fsdp/models/llama.py shared_scale)
    embed_scale_learned: bool = False
    # standard: the fairseq parameterization; ntk: unit-variance weights with outputs scaled by
    # 1/sqrt(fan_in), an option of this tool after Su 2021, kexue.fm/archives/8620,
    # "NTK Parameterization".
    parameterization: str = "standard"
    # standard: logits / sqrt(head_dim); t5: no 1/sqrt(head_dim) in the logits; instead q and k
    # each get their init variance divided by sqrt(head_dim), so q.k loses a factor head_dim.
    attention: str = "standard"
    # Biases of q/k/v at init: zero (LiyuanLucasLiu/Transformer-Clinic) or torch_default
    # (layer6ai-labs/T-Fixup), as their fairseq/modules/multihead_attention.py set them.
    qkv_bias_init: str = "zero"
    max_positions: int = 1024
    # sinusoidal: fairseq's fixed [sin | cos] table; learned: a trained table of max_positions
    # rows (nanoGPT model.py wpe, initialized as the token table)
    positions: str = "sinusoidal"
    activation_checkpointing: bool = False
    # QK-norm on every head's queries and keys before the dot product, in self- and
    # cross-attention: none | layernorm | rmsnorm (Dehghani et al. 2023; Wortsman et al. 2023;
    # logits still / sqrt(head_dim)) | l2 (Henry et al. 2020, Query-Key Normalization for
    # Transformers: logits g * q_hat . k_hat, g learnable, replacing 1/sqrt(head_dim)).
    qk_norm: str = "none"
    # qk_norm=l2: g's initial value. Henry et al. (Sec. 3) set g0 = log2(L^2 - L) with L the 97.5th
    # percentile of training sequence lengths; 12.32 = log2(72^2 - 72), their L for en-vi and
    # en-he (CyndxAI/QKNorm QKNorm/configurations.py seq_len_threshold=72). Set it for your data.
    qk_norm_temperature: float = 12.32
    # sigma-reparam (Zhai et al., ICML 2023): every attention q/k/v/out and FFN fc1/fc2 weight W
    # is used as (gamma / sigma(W)) W, sigma by one power-iteration step per training forward,
    # gamma learnable (embeddings and the output projection stay plain). gamma's init: sigma
    # (= sigma(W_0), the model equals the plain one at init; apple/ml-sigma-reparam vision) or
    # one (apple/ml-sigma-reparam speech).
    sigma_reparam: bool = False
    sigma_reparam_gamma_init: str = "sigma"
    # FixNorm: token-table rows used at unit L2 length, in the embeddings and the output projection
    # (Nguyen & Salazar 2019, Transformers without Tears; tnq177/transformers_without_tears model.py)
    fixnorm: bool = False

    @property
    def num_encoder_layers(self) -> int:
        return self.layers if self.encoder_layers is None else self.encoder_layers

    @property
    def num_decoder_layers(self) -> int:
        return self.layers if self.decoder_layers is None else self.decoder_layers


# The norm placements, one per PLACEMENTS entry in runner/model/sublayer.py (the slot table;
# tests/config/test_validate.py checks the two agree, and the conf/norm options, README and docs against them).
Placement = Literal["post", "pre", "none", "sandwich", "b2t", "resi_dual", "mix", "peri"]


@options
@dataclass
class NormConfig:
    """Norm placement (fairseq's normalize_before) and kind: the fields every placement reads.
    The slot table per placement is in runner/model/sublayer.py, and so are the options of a
    placement that reads its own (MixOptions: norm.mix_ratio, ...), subclasses of this class that
    conf/norm/<placement>.yaml names as its schema; code that rebuilds a stored config asks for
    the class by placement (runner.model.norm_options_class)."""

    placement: Placement = "post"
    # Per-stack placement, null = `placement` (Admin Table 1 mixes a Post-LN encoder with a
    # Pre-LN decoder: norm.decoder_placement=pre).
    encoder_placement: Optional[Placement] = None
    decoder_placement: Optional[Placement] = None
    kind: Literal["layernorm", "rmsnorm", "dyt", "scalenorm"] = "layernorm"
    eps: float = 1e-5
    # A norm after the last layer of each stack. null: the placement's default (on for pre and
    # sandwich, off for post and none).
    final_norm: Optional[bool] = None
    # A norm on the embedding sum before the first layer: with post it gives the Lipschitz
    # paper's "v1" computation order (Xu et al. 2020, Fig. 1).
    embedding_norm: bool = False
    # kind=dyt: alpha's init in DyT(x) = gamma tanh(alpha x) + beta (Zhu et al. 2025, CVPR,
    # Transformers without Normalization; jiachenzhu/DyT dynamic_tanh.py alpha_init_value=0.5)
    dyt_alpha: float = 0.5
    # LayerNorm Scaling (Sun et al. 2025, The Curse of Depth): every pre-norm output in layer l
    # (1-based, per stack) is multiplied by 1/sqrt(l); with placement pre or mix only
    layernorm_scaling: bool = False


@dataclass
class InitConfig:
    """Initialization scheme (runner/init/): the base of every scheme's options. Each scheme
    declares the options it reads (typed, choices as Literal types) in its own file,
    runner/init/<scheme>.py, as a subclass of this class; conf/init/<scheme>.yaml names that
    schema (Hydra's ConfigStore holds it, runner/cli/compose.py), so `init=admin init.omega=scalar`
    is checked against Admin's options and a key no scheme option has fails at composition. Code
    that rebuilds a stored config asks the init registry for the class by name
    (runner.init.options_class)."""

    name: str = "xavier"


@dataclass
class OptimConfig:
    """Optimizer (runner/train/optim.py). beta1/beta2 are separate fields so a sweep can vary one."""

    name: str = "adam"  # adam | radam | sgd
    lr: float = 5e-4
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-8
    weight_decay: float = 0.0
    clip_norm: float = 0.0  # 0 disables clipping (fairseq semantics)
    momentum: float = 0.0  # sgd only
    # radam: admin (no update while rho_t < 5, decoupled decay every step; Transformer-Clinic
    # radam_fairseq/radam.py), sgd_fallback (SGD-momentum while rho_t < 5; LiyuanLucasLiu/RAdam),
    # torch (torch.optim.RAdam, rho_t > 5).
    radam_mode: str = "admin"
    fused: Optional[bool] = None  # null: fused kernels on CUDA and CPU (AdamW, SGD)


@dataclass
class ScheduleConfig:
    """Learning-rate schedule after warmup (fairseq lr_scheduler semantics)."""

    name: str = "inverse_sqrt"  # inverse_sqrt | linear | constant | cosine
    # inverse_sqrt with warmup.updates = 0: lr(t) = lr * sqrt(D / (D + t)) (T-Fixup's
    # inverse_sqrt_nowarmup, --decay-period 4000 in layer6ai-labs/T-Fixup Train_IWSLT_TFixup_example.sh).
    decay_period: int = 4000
    # linear, cosine: decay to this value at trainer.max_updates (cosine: nanoGPT train.py get_lr,
    # min_lr + (lr - min_lr) * (1 + cos(pi * progress)) / 2 after warmup)
    min_lr: float = 0.0


@dataclass
class WarmupConfig:
    """Linear warmup from init_lr to optim.lr over `updates` updates; 0 = no warmup."""

    # None (warmup=auto, conf/train.yaml's default): the init scheme's warmup, filled in before
    # the run is checked (runner/config/resolve.py)
    updates: Optional[int] = 4000
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

    name: str = "toy"  # toy | multi30k | iwslt14 | custom (translation); shakespeare_char | text (task=lm)
    dir: Optional[str] = None
    source_lang: str = "de"
    target_lang: str = "en"
    train_split: str = "train"
    valid_split: str = "valid"
    test_split: str = "test"
    joined_dictionary: bool = True
    # none: the text is already tokenized and is used as it is; moses: raw text, Moses
    # punctuation normalization + tokenizer (sacremoses, source_lang / target_lang rules) before
    # the BPE, hypotheses detokenized for sacreBLEU against the raw references (docs/data.md).
    tokenize: str = "none"
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
    # task=lm: each update reads batch_size blocks of block_size tokens at random offsets
    # (nanoGPT train.py get_batch; its CPU shakespeare_char run: block 64, batch 12)
    block_size: int = 64
    batch_size: int = 12
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
class EarlyStopConfig:
    """A stopping rule on the validation loss (label-smoothed, as in metrics.jsonl), checked at
    every validation (every trainer.valid_interval updates). A validation improves when its loss
    is more than `min_delta` nats below the loss of the last validation that improved (the first
    validation always does); the run stops at the first validation, at update `min_updates` or
    later, whose update is `window` or more updates after the last improvement. It then ends as a
    finished run (status ok, final checkpoint, final BLEU), with stopped_early and stop_update in
    result.json; trainer.max_updates stays the cap. Off with window=0 (the default)."""

    window: int = 0  # updates without an improvement before the run stops; 0 = off
    min_delta: float = 0.0  # nats a validation loss must drop below the reference to count
    min_updates: int = 0  # the rule never stops a run before this update


@dataclass
class TrainerConfig:
    max_updates: int = 1000
    max_epochs: int = 0  # 0 = no epoch limit
    update_freq: int = 1  # gradient accumulation (micro-batches per update)
    seed: int = 1
    device: str = "auto"  # auto | cpu | cuda
    devices: int = 1  # DDP processes (torchrun or submitit tasks)
    precision: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | fp32 | bf16 | fp16
    # fp16: a run whose loss scale falls below this has diverged (its gradients overflow on
    # every update); fairseq's --min-loss-scale default (fairseq/optim/dynamic_loss_scaler.py)
    min_loss_scale: float = 1e-4
    compile: bool = False
    # what trainer.compile compiles: model (one graph of the whole model) or layers (each
    # encoder/decoder layer on its own, the embeddings, output projection and loss eager: the
    # layers of a stack share one compiled code, so compile time does not grow with depth)
    compile_scope: str = "model"
    threads: int = 0  # CPU threads; 0 = torch's default
    # training skips the padding in position-wise layers (runner/model/packing.py); null: on
    # CPU (measured faster there), off on CUDA (not measured on a GPU yet)
    unpad: Optional[bool] = None
    label_smoothing: float = 0.1
    log_interval: int = 10
    valid_interval: int = 500  # updates; 0 = only at the end
    save_interval: int = 500  # updates between checkpoints; 0 = only at the end
    # minutes between extra saves of checkpoint_last.pt alone (at the next log window's end), so
    # that a killed run loses at most this much work; 0 = off. They change nothing but the file.
    save_interval_min: float = 5.0
    keep_checkpoints: int = 1  # numbered checkpoints kept (for averaging), besides checkpoint_last
    valid_max_batches: int = 0  # 0 = the whole valid split
    resume: bool = True  # continue from checkpoint_last.pt / skip a finished run
    progress: Optional[bool] = None  # null: a live bar when the console is a terminal
    # The old switch of the TensorBoard logger, kept as an alias of the `logger` group (below):
    # null = as `logger` says; false = no TensorBoard whatever `logger` says; true = TensorBoard
    # too. Prefer logger=tensorboard|csv|mlflow|wandb|many_loggers (docs/training.md).
    tensorboard: Optional[bool] = None
    # instability telemetry every N updates (runner/run/telemetry.py, docs/training.md
    # "Telemetry"); 0 = off. On: per-layer max |x|, attention entropy and max logit, the fp16 loss
    # scale, and the first non-finite value's update and sublayer in result.json
    telemetry_interval: int = 0
    # evaluation (runner/run/evaluate.py, docs/evaluation.md). In-training decoding uses fairseq's
    # --eval-bleu settings (fairseq examples/translation/README.md:
    # beam 5, max_len_a 1.2, max_len_b 10).
    valid_bleu: bool = False  # tokenized BLEU of the valid split at every validation
    # none | loss | bleu (bleu implies valid_bleu): keep checkpoint_best.pt at the best validation
    best_checkpoint_metric: str = "none"
    final_bleu: bool = False  # decode the test split at the end of the run; BLEU into result.json
    eval_beam: int = 5
    eval_lenpen: float = 1.0
    eval_max_len_a: float = 1.2
    eval_max_len_b: int = 10
    eval_average_last: int = 10  # final_bleu: average the last K kept numbered checkpoints
    # with final_bleu (without it, nothing is scored and this does nothing): also score
    # checkpoint_last.pt alone (bleu_last in result.json), to see what the average of the last
    # checkpoints gains or costs where the curve has not flattened
    final_bleu_last: bool = False
    divergence: DivergenceConfig = field(default_factory=DivergenceConfig)
    # stop when the validation loss stops improving (EarlyStopConfig above); off by default
    early_stop: EarlyStopConfig = field(default_factory=EarlyStopConfig)


@dataclass
class TensorBoardLoggerConfig:
    """logger=tensorboard: TensorBoard scalars of every metrics.jsonl record, the config as text,
    the result's numbers under result/."""

    enabled: bool = False  # set by choosing it: logger=tensorboard (the default)
    save_dir: Optional[str] = None  # null: the run folder (events.out.tfevents.* beside metrics.jsonl)


@dataclass
class CsvLoggerConfig:
    """logger=csv: one CSV per record split (train.csv, valid.csv, telemetry.csv), params.csv
    (the flattened config) and result.csv."""

    enabled: bool = False  # set by choosing it: logger=csv
    save_dir: Optional[str] = None  # null: <run folder>/csv


@dataclass
class MlflowLoggerConfig:
    """logger=mlflow (pip install 'deepinit[mlflow]'): params, metrics and result into an MLflow
    tracking store; a resumed run continues its MLflow run."""

    enabled: bool = False  # set by choosing it: logger=mlflow
    # null: sqlite:///outputs/mlflow.db under the working directory, one store for every run and
    # sweep started there (`mlflow ui --backend-store-uri sqlite:///outputs/mlflow.db`); any
    # MLflow tracking URI otherwise (a server http://..., another sqlite:///PATH)
    tracking_uri: Optional[str] = None
    experiment_name: str = "deepinit"
    run_name: Optional[str] = None  # null: the run folder's name
    tags: dict[str, str] = field(default_factory=dict)


@dataclass
class WandbLoggerConfig:
    """logger=wandb (pip install 'deepinit[wandb]'): Weights & Biases, offline by default
    (`wandb sync <run folder>/wandb/offline-run-*` uploads later)."""

    enabled: bool = False  # set by choosing it: logger=wandb
    project: str = "deepinit"
    entity: Optional[str] = None
    name: Optional[str] = None  # null: the run folder's name
    mode: str = "offline"  # offline | online | disabled
    save_dir: Optional[str] = None  # null: the run folder (wandb writes <save_dir>/wandb/)
    tags: list[str] = field(default_factory=list)


@dataclass
class LoggerConfig:
    """Experiment trackers a run writes to besides metrics.jsonl (runner/run/loggers.py), chosen
    with the logger group: logger=tensorboard (the default), logger=csv, logger=mlflow,
    logger=wandb, several with logger=[csv,mlflow] or logger=many_loggers (all four), none with
    ~logger. Choosing one sets its `enabled`; its other fields are set after choosing it
    (logger=mlflow logger.mlflow.tracking_uri=...)."""

    tensorboard: TensorBoardLoggerConfig = field(default_factory=TensorBoardLoggerConfig)
    csv: CsvLoggerConfig = field(default_factory=CsvLoggerConfig)
    mlflow: MlflowLoggerConfig = field(default_factory=MlflowLoggerConfig)
    wandb: WandbLoggerConfig = field(default_factory=WandbLoggerConfig)


@dataclass
class Config:
    # translation: the encoder-decoder model on a parallel corpus; lm: a decoder-only causal
    # language model (runner/model/lm.py) on a text corpus (data=shakespeare_char)
    task: str = "translation"
    model: ModelConfig = field(default_factory=ModelConfig)
    norm: NormConfig = field(default_factory=NormConfig)
    init: InitConfig = field(default_factory=InitConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    # Free-form record of the sweep preset that produced this run (set by sweeps/*.yaml).
    sweep: Any = None
