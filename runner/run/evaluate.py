"""Scoring a run: `deepinit eval`'s decode-and-score of a run folder, the valid-BLEU callback
and the final test BLEU a run may compute when it ends. Checkpoints are read through the run
folder (runner/run/folder.py) and the model is rebuilt through runner/run/build.py."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional, Sequence

import torch

from runner.config import Config, config_from_dict
from runner.data import build_data
from runner.data.corpus import load_translation_data
from runner.data.dataset import TokenizedSplit
from runner.data.dictionary import Dictionary
from runner.decode.scoring import bleu_scores, detokenize, tokenized_bleu
from runner.decode.search import decode_split
from runner.files import atomic_write_text
from runner.init import options_class
from runner.model.sublayer import norm_options_class
from runner.run import folder
from runner.run.build import model_for


class EvalError(ValueError):
    """Bad input to `deepinit eval`: reported as one line, exit 2."""


def select_checkpoints(run_dir: Path, average_last: int) -> list[Path]:
    """The last `average_last` numbered checkpoints, or checkpoint_last.pt when there are none
    (or average_last <= 1 asks for no averaging)."""
    numbered = folder.numbered_checkpoints(run_dir)
    if average_last > 1 and numbered:
        return numbered[-average_last:]
    last = run_dir / folder.LAST
    if last.exists():
        return [last]
    if numbered:
        return numbered[-1:]
    raise EvalError(f"{run_dir}: no checkpoint ({folder.LAST} or checkpoint_<step>.pt)")


def load_eval_data(cfg, split: str):
    """The corpus with the dictionaries the model was trained on: the same deterministic
    build as training (the toy task from its seed; corpora from the cache), plus `split`."""
    data = build_data(cfg.data)
    if split not in data.splits and cfg.data.name != "toy":
        extra = load_translation_data(cfg.data, splits=[split],
                                      dictionaries=(data.src_dict, data.tgt_dict))
        data.splits[split] = extra.splits[split]
        data.references[split] = extra.references[split]
        if split in extra.raw_references:
            data.raw_references[split] = extra.raw_references[split]
    if split not in data.splits:
        raise EvalError(f"unknown split {split!r}: this run's data has "
                        f"{', '.join(sorted(data.splits))}")
    return data


def check_dictionaries(run_dir: Path, src_dict, tgt_dict, error: type[ValueError] = EvalError) -> None:
    """A rebuilt vocabulary of the same size but other words would decode (or resume training)
    silently wrong: compare it with the one the run saved (dict.src.txt / dict.tgt.txt) when
    present; `error` is the one-line error the caller's command reports."""
    for side, rebuilt in (("src", src_dict), ("tgt", tgt_dict)):
        saved_path = run_dir / f"dict.{side}.txt"
        if saved_path.is_file() and Dictionary.load(saved_path).symbols != rebuilt.symbols:
            raise error(f"the data changed since training: its vocabulary differs from "
                        f"{saved_path} (rebuild the corpus as it was, or retrain)")


# ----------------------------------------------------------------------------- deepinit eval
def evaluate_run(run_dir: str | Path, split: str = "test", beam: int = 5, lenpen: float = 1.0,
                 average_last: int = 10, max_len_a: float = 0.0, max_len_b: int = 200,
                 max_tokens: int = 4096, batch_size: int = 128, device: str = "cpu",
                 update_result: bool = True, echo=print,
                 checkpoint: Optional[str | Path] = None, out_name: Optional[str] = None) -> dict:
    """Decode and score one split of a run; writes RUN_DIR/eval/<out_name>.* (out_name defaults
    to the split) and adds the scores to result.json. Returns the eval record (also written to
    eval/<out_name>.json). `checkpoint` (a file name in the run folder, or a path) replaces the
    averaging."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise EvalError(f"run folder not found: {run_dir}")
    if beam < 1:
        raise EvalError(f"--beam {beam}: expected at least 1")
    if checkpoint is not None:
        path = Path(checkpoint) if Path(checkpoint).is_file() else run_dir / checkpoint
        if not path.is_file():
            raise EvalError(f"checkpoint not found: {checkpoint}")
        paths = [path]
    else:
        paths = select_checkpoints(run_dir, average_last)
    try:
        config = folder.load_checkpoint(paths[-1])["config"]
    except Exception as exc:  # unreadable or foreign file
        raise EvalError(f"{paths[-1]}: not a deepinit checkpoint ({type(exc).__name__}: {exc})")
    cfg = config_from_dict(config, options_class, norm_options_class)
    data = load_eval_data(cfg, split)
    src_dict, tgt_dict = data.src_dict, data.tgt_dict
    check_dictionaries(run_dir, src_dict, tgt_dict)
    model = model_for(cfg, len(src_dict), len(tgt_dict), tgt_dict.pad_index)
    state = folder.average_checkpoints(paths) if len(paths) > 1 else folder.load_checkpoint(paths[0])["model"]
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:  # e.g. the corpus changed since training: other dictionaries
        first = str(exc).strip().splitlines()[-1].strip()
        raise EvalError(f"{paths[-1]} does not fit the model rebuilt from its config and data "
                        f"(dictionaries {len(src_dict)}/{len(tgt_dict)} types): {first}")
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                       ("cpu" if device == "auto" else device))
    model.to(dev).select_kernels(dev.type).eval()

    t0 = time.perf_counter()
    hyps = decode_split(model, data.splits[split], beam=beam, lenpen=lenpen, max_len_a=max_len_a,
                        max_len_b=max_len_b, max_tokens=max_tokens, batch_size=batch_size,
                        device=dev, pad=tgt_dict.pad_index, bos=tgt_dict.bos_index,
                        eos=tgt_dict.eos_index)
    seconds = time.perf_counter() - t0
    hyp_text = [tgt_dict.string(t, data.bpe_symbol) for t in hyps.tokens]
    ref_text = data.references[split]
    # data.tokenize=moses: sacreBLEU scores against the raw references, not detokenized ones.
    raw_refs = data.raw_references.get(split)
    lang = cfg.data.target_lang
    scores = bleu_scores(hyp_text, ref_text, lang, raw_refs)

    out = run_dir / "eval"
    out.mkdir(exist_ok=True)
    stem = out_name or split
    for name, lines in ((f"{stem}.hyp", hyp_text), (f"{stem}.ref", ref_text),
                        (f"{stem}.detok.hyp", detokenize(hyp_text, lang)),
                        (f"{stem}.detok.ref",
                         raw_refs if raw_refs is not None else detokenize(ref_text, lang))):
        atomic_write_text(out / name, "".join(line + "\n" for line in lines))
    record = {
        "split": split, "sentences": len(hyp_text),
        "bleu": scores["bleu_tokenized"], "sacrebleu": scores["sacrebleu_detok"],
        "sacrebleu_signature": scores["sacrebleu_signature"],
        # what sacreBLEU's references were: the raw text (data.tokenize=moses) or the
        # tokenized references detokenized
        "sacrebleu_references": "raw" if raw_refs is not None else "detokenized",
        "beam": beam, "lenpen": lenpen, "max_len_a": max_len_a, "max_len_b": max_len_b,
        "checkpoints": [p.name for p in paths], "averaged": len(paths),
        "decode_seconds": seconds, "sentences_per_s": len(hyp_text) / max(seconds, 1e-9),
        "device": str(dev),
    }
    folder.write_json(out / f"{stem}.json", record)
    if update_result:
        result = folder.read_result(run_dir)
        if result is None:
            echo(f"note: {run_dir / 'result.json'} missing or unreadable (run unfinished?); "
                 "scores are in eval/ only")
        else:
            evals = dict(result.get("eval") or {})
            evals[stem] = record
            result["eval"] = evals
            # the headline numbers sweeps rank by; a score filed under its own name leaves them
            if split == cfg.data.test_split and out_name is None:
                result["bleu"] = record["bleu"]
                result["sacrebleu"] = record["sacrebleu"]
                result["sacrebleu_signature"] = record["sacrebleu_signature"]
            folder.write_json(run_dir / "result.json", result)
    return record


# ----------------------------------------------------------------------------- during training
def split_bleu(model, split: TokenizedSplit, references: Sequence[str], tgt_dict,
               bpe_symbol: Optional[str], trainer_cfg, max_tokens: int,
               device: torch.device | str) -> float:
    """Tokenized BLEU of `model` on one split with the trainer.eval_* settings (for
    trainer.valid_bleu). Leaves the model in eval mode; uses no random numbers."""
    t = trainer_cfg
    hyps = decode_split(model, split, beam=t.eval_beam, lenpen=t.eval_lenpen,
                        max_len_a=t.eval_max_len_a, max_len_b=t.eval_max_len_b,
                        max_tokens=max_tokens, device=device, pad=tgt_dict.pad_index,
                        bos=tgt_dict.bos_index, eos=tgt_dict.eos_index)
    return tokenized_bleu([tgt_dict.string(h, bpe_symbol) for h in hyps.tokens], references)


def final_scores(cfg: Config, run_dir: Path, device: torch.device | str = "cpu") -> dict:
    """trainer.final_bleu: the test split scored like `deepinit eval` (averaging the last
    trainer.eval_average_last kept checkpoints), as result.json fields. With
    trainer.final_bleu_last, checkpoint_last.pt is also scored alone (bleu_last, sacrebleu_last;
    its files are eval/<split>.last.*), unless it was the one checkpoint scored already."""
    t = cfg.trainer
    split = cfg.data.test_split

    def score(**which) -> dict:
        return evaluate_run(run_dir, split=split, beam=t.eval_beam, lenpen=t.eval_lenpen,
                            average_last=t.eval_average_last, max_len_a=t.eval_max_len_a,
                            max_len_b=t.eval_max_len_b, max_tokens=cfg.data.max_tokens,
                            device=str(device), update_result=False, **which)

    record = score()
    out = {"bleu": record["bleu"], "sacrebleu": record["sacrebleu"],
           "sacrebleu_signature": record["sacrebleu_signature"], "eval": {split: record}}
    if not t.final_bleu_last:
        return out
    if record["checkpoints"] == ["checkpoint_last.pt"]:  # eval_average_last 0/1: already scored alone
        out.update(bleu_last=record["bleu"], sacrebleu_last=record["sacrebleu"])
        return out
    try:
        last = score(checkpoint="checkpoint_last.pt", out_name=f"{split}.last")
    except Exception as exc:  # the averaged score stands; say why the other is missing
        out["bleu_last_error"] = f"{type(exc).__name__}: {exc}"
        return out
    out.update(bleu_last=last["bleu"], sacrebleu_last=last["sacrebleu"])
    out["eval"][f"{split}.last"] = last
    return out
