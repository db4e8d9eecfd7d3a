"""Cross-field rules checked before any data loads.

`validate(cfg)` raises ConfigError with one line that names the key and what is expected. What
an init scheme requires of the rest of the config (its norm placement, say) is the scheme's own
rule, checked by runner.init.check_requirements; the run assembly calls both.
"""
from __future__ import annotations

import math
from typing import Any

from runner.config.options import literal_choices


class ConfigError(ValueError):
    """A user error in the configuration: reported as one line, exit code 2, no traceback."""


LM_CORPORA = ("shakespeare_char", "text")  # data.name values that are text for task=lm

CHOICES = {
    "task": ("translation", "lm"),
    "model.positions": ("sinusoidal", "learned"),
    "model.activation": ("relu", "gelu"),
    "model.share_embeddings": ("none", "decoder_io", "all"),
    "model.parameterization": ("standard", "ntk"),
    "model.attention": ("standard", "t5"),
    "model.qkv_bias_init": ("zero", "torch_default"),
    "model.qk_norm": ("none", "layernorm", "rmsnorm", "l2"),
    "model.sigma_reparam_gamma_init": ("sigma", "one"),
    "optim.name": ("adam", "radam", "sgd"),
    "optim.radam_mode": ("admin", "sgd_fallback", "torch"),
    "schedule.name": ("inverse_sqrt", "linear", "constant", "cosine"),
    "data.name": ("toy", "multi30k", "iwslt14", "custom", *LM_CORPORA),
    "data.bpe": ("none", "tokenizers", "codes"),
    "data.tokenize": ("none", "moses"),
    "data.empty_lines": ("skip", "error"),
    "trainer.device": ("auto", "cpu", "cuda"),
    "trainer.precision": ("auto", "fp32", "bf16", "fp16"),
    "trainer.compile_scope": ("model", "layers"),
    "trainer.best_checkpoint_metric": ("none", "loss", "bleu"),
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
    # Literal fields: the norm group's and each init scheme's options (runner/config/options.py)
    for key, value, allowed in literal_choices(cfg):
        if value not in allowed:
            names = ", ".join(str(a) for a in allowed if a is not None)
            raise ConfigError(f"{key}={value!r}: expected one of {names}"
                              + (" or null" if None in allowed else ""))

    if cfg.task == "lm":  # before the per-stack rules, whose words assume two stacks
        for key, use in (("norm.encoder_placement", "norm=... or norm.decoder_placement"),
                         ("model.encoder_layers", "model.layers or model.decoder_layers")):
            if _get(cfg, key) is not None:
                raise ConfigError(f"{key}={_get(cfg, key)}: task=lm's model has one stack, on the "
                                  f"decoder side, and no encoder; use {use}")

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
    if not trainer.min_loss_scale > 0:
        raise ConfigError(f"trainer.min_loss_scale={trainer.min_loss_scale}: expected a positive number")
    for key in ("optim.beta1", "optim.beta2"):
        value = _get(cfg, key)
        if not 0.0 <= value < 1.0:
            raise ConfigError(f"{key}={value}: expected a value in [0, 1)")
    for key in ("optim.eps", "optim.weight_decay", "optim.clip_norm", "optim.momentum",
                "warmup.init_lr", "trainer.max_epochs", "trainer.valid_interval",
                "trainer.save_interval", "trainer.save_interval_min", "trainer.keep_checkpoints",
                "trainer.threads",
                "warmup.updates", "trainer.valid_max_batches", "trainer.eval_max_len_b",
                "trainer.eval_average_last", "trainer.eval_max_len_a", "trainer.eval_lenpen",
                "trainer.telemetry_interval", "trainer.early_stop.window",
                "trainer.early_stop.min_updates"):
        value = _get(cfg, key)
        if value is not None and value < 0:  # warmup.updates None: left to the init scheme (resolve.py)
            raise ConfigError(f"{key}={value}: expected a value >= 0")
    if trainer.save_interval % trainer.log_interval:
        raise ConfigError(
            f"trainer.save_interval={trainer.save_interval} must be a multiple of "
            f"trainer.log_interval={trainer.log_interval} (checkpoints close a log window, so a "
            "resumed run logs exactly what an uninterrupted one does)")
    _check_early_stop(trainer)
    if cfg.schedule.min_lr < 0:
        raise ConfigError(
            f"schedule.min_lr={cfg.schedule.min_lr}: expected >= 0 (a negative min_lr makes the "
            "linear schedule's lr negative)")
    if cfg.schedule.min_lr > optim.lr:
        raise ConfigError(f"schedule.min_lr={cfg.schedule.min_lr}: expected <= optim.lr={optim.lr}")
    if (cfg.schedule.name == "cosine" and cfg.warmup.updates is not None
            and cfg.warmup.updates >= trainer.max_updates):
        raise ConfigError(f"schedule=cosine decays after the warmup: warmup.updates={cfg.warmup.updates} "
                          f"must be shorter than trainer.max_updates={trainer.max_updates}")
    if cfg.schedule.decay_period <= 0:
        raise ConfigError(f"schedule.decay_period={cfg.schedule.decay_period}: expected > 0")
    if cfg.warmup.updates is not None and cfg.warmup.updates > trainer.max_updates:
        raise ConfigError(
            f"warmup.updates={cfg.warmup.updates} is longer than trainer.max_updates="
            f"{trainer.max_updates}: shorten the warmup or train longer")
    if cfg.warmup.init_lr > optim.lr:
        raise ConfigError(f"warmup.init_lr={cfg.warmup.init_lr}: expected <= optim.lr={optim.lr}")
    if cfg.data.tokenize != "none" and cfg.data.name in ("toy", "iwslt14"):
        raise ConfigError(
            f"data.tokenize={cfg.data.tokenize} is for raw text, but data={cfg.data.name} "
            + ("is generated already tokenized" if cfg.data.name == "toy" else
               "reads fairseq's prepared text, already Moses-tokenized and BPE'd")
            + ": set data.tokenize=none, or use data=custom for raw text")
    if model.embed_scale_learned and model.embed_scale:
        raise ConfigError("model.embed_scale_learned=true replaces the fixed sqrt(dim) factor: set "
                          "model.embed_scale=false")
    if model.share_embeddings == "all" and not cfg.data.joined_dictionary:
        raise ConfigError(
            "model.share_embeddings=all needs a joined dictionary: set data.joined_dictionary=true "
            "or model.share_embeddings=decoder_io")
    if cfg.norm.eps <= 0:
        raise ConfigError(f"norm.eps={cfg.norm.eps}: expected > 0")
    if cfg.norm.placement == "none" and (cfg.norm.final_norm or cfg.norm.embedding_norm):
        raise ConfigError("norm=none removes every norm: unset norm.final_norm / norm.embedding_norm")
    _check_new_norms(cfg)
    _check_mix_and_layernorm_scaling(cfg)
    _check_qk_norm_and_sigma_reparam(cfg)
    if trainer.compile and trainer.telemetry_interval > 0:
        # hooks added after torch.compile are not traced into its graphs: the figures would be
        # wrong (an attention entropy of 0), and compile_scope=layers would recompile per layer
        raise ConfigError("trainer.telemetry_interval=%d needs an eager run: torch.compile does not trace "
                          "telemetry's hooks (set trainer.compile=false, or trainer.telemetry_interval=0)"
                          % trainer.telemetry_interval)
    if trainer.device == "cpu" and trainer.precision == "fp16":
        raise ConfigError("trainer.precision=fp16 needs CUDA: use trainer.precision=bf16 or fp32 on CPU")
    if trainer.devices > 1 and trainer.update_freq < 1:
        raise ConfigError("trainer.update_freq must be >= 1")
    _check_loggers(cfg)
    _check_task(cfg)


def _check_task(cfg: Any) -> None:
    """task=lm reads a text corpus in blocks and scores no BLEU; task=translation a parallel one."""
    data, trainer = cfg.data, cfg.trainer
    if cfg.task == "translation":
        if data.name in LM_CORPORA:
            raise ConfigError(f"data={data.name} is a language-model corpus: use task=lm, or "
                              "a parallel corpus (data=toy|multi30k|iwslt14|custom)")
        return
    if data.name not in LM_CORPORA:
        raise ConfigError(f"task=lm needs a text corpus: data={'|'.join(LM_CORPORA)}, not "
                          f"data={data.name}")
    for key in ("data.block_size", "data.batch_size"):
        if _get(cfg, key) <= 0:
            raise ConfigError(f"{key}={_get(cfg, key)}: expected a positive integer")
    if data.block_size > cfg.model.max_positions:
        raise ConfigError(f"data.block_size={data.block_size} is longer than model.max_positions="
                          f"{cfg.model.max_positions}: raise model.max_positions or shorten the blocks")
    for key in ("trainer.valid_bleu", "trainer.final_bleu"):
        if _get(cfg, key):
            raise ConfigError(f"{key}=true: BLEU scores translations; task=lm reports loss, bits "
                              "per character and perplexity, so set it false")
    if trainer.best_checkpoint_metric == "bleu":
        raise ConfigError("trainer.best_checkpoint_metric=bleu: task=lm has no BLEU; use loss or none")
    if trainer.max_epochs:
        raise ConfigError(f"trainer.max_epochs={trainer.max_epochs}: task=lm draws blocks at random "
                          "offsets and has no epochs; set trainer.max_updates and max_epochs=0")


def _check_early_stop(trainer: Any) -> None:
    """The stopping rule's settings (trainer.early_stop); window and min_updates are checked >= 0
    with the other counts."""
    rule = trainer.early_stop
    if not (math.isfinite(rule.min_delta) and rule.min_delta >= 0):
        raise ConfigError(f"trainer.early_stop.min_delta={rule.min_delta}: expected a finite value "
                          ">= 0 (nats the validation loss must drop to count as an improvement)")
    if rule.window > 0 and trainer.valid_interval == 0:
        raise ConfigError(f"trainer.early_stop.window={rule.window} needs validations during the "
                          "run, but trainer.valid_interval=0 validates only at the end: set "
                          "trainer.valid_interval, or trainer.early_stop.window=0")


def _check_loggers(cfg: Any) -> None:
    """The experiment trackers' own fields (whether their packages are installed is checked
    when the run starts, runner/run/loggers.py)."""
    for name in ("tensorboard", "csv", "mlflow", "wandb"):
        options = getattr(cfg.logger, name)
        if not options.enabled and options != type(options)():
            raise ConfigError(f"logger.{name}.* is set but the {name} logger is not chosen: add "
                              f"logger={name} (or a list, e.g. logger=[tensorboard,{name}])")
    wandb = cfg.logger.wandb
    if wandb.mode not in ("offline", "online", "disabled"):
        raise ConfigError(f"logger.wandb.mode={wandb.mode!r}: expected one of offline, online, disabled")
    if not cfg.logger.mlflow.experiment_name:
        raise ConfigError("logger.mlflow.experiment_name is empty: name the MLflow experiment")


def _check_new_norms(cfg: Any) -> None:
    """DyT's alpha and ResiDual's LN(d_N) (the final_norm slot); ResiDual's s and alpha are
    checked with the placement's options (runner.model.sublayer.check_placement_options)."""
    norm = cfg.norm
    if norm.dyt_alpha <= 0:
        raise ConfigError(f"norm.dyt_alpha={norm.dyt_alpha}: expected > 0 (the paper uses 0.5)")
    stacks = (norm.encoder_placement or norm.placement, norm.decoder_placement or norm.placement)
    if "resi_dual" in stacks and norm.final_norm is False:
        raise ConfigError("norm=resi_dual outputs alpha * x_N + LN(d_N) and needs its final norm: "
                          "unset norm.final_norm")


def _check_mix_and_layernorm_scaling(cfg: Any) -> None:
    """LayerNorm Scaling only where a branch input is a pre-norm output that
    no later norm in the branch undoes (Pre-LN layers: norm=pre, or mix's Pre-LN layers)."""
    norm = cfg.norm
    if norm.layernorm_scaling:
        stacks = {norm.encoder_placement or norm.placement, norm.decoder_placement or norm.placement}
        other = sorted(stacks - {"pre", "mix"})
        if other:
            raise ConfigError(f"norm.layernorm_scaling=true scales Pre-LN outputs and is defined for "
                              f"norm=pre or norm=mix on both stacks, not {other[0]}: use norm=pre "
                              "or norm=mix, or unset norm.layernorm_scaling")


def _check_qk_norm_and_sigma_reparam(cfg: Any) -> None:
    """QK-norm's temperature and the combinations QK-norm and sigma-reparam do not define."""
    model = cfg.model
    if model.qk_norm == "l2" and model.qk_norm_temperature <= 0:
        raise ConfigError(f"model.qk_norm_temperature={model.qk_norm_temperature}: expected > 0 "
                          "(Henry et al. 2020 start at log2(L^2 - L))")
    if model.qk_norm != "none" and model.attention == "t5":
        raise ConfigError(f"model.qk_norm={model.qk_norm} normalizes q and k, which undoes "
                          "model.attention=t5's q/k init scaling: use model.attention=standard")
    if model.sigma_reparam and model.parameterization == "ntk":
        raise ConfigError("model.sigma_reparam=true divides each weight by its spectral norm, which "
                          "cancels model.parameterization=ntk's output scale: use "
                          "model.parameterization=standard")
    if model.sigma_reparam and model.activation_checkpointing:
        raise ConfigError("model.sigma_reparam=true advances its power iteration in every training "
                          "forward, so a checkpointed recomputation would see another sigma: set "
                          "model.activation_checkpointing=false")
