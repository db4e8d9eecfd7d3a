"""The script behind postln-no-warmup-mode-gap.json (run with the repository on PYTHONPATH).
Post-LN no-warmup: is the train/valid loss gap the model's train/eval mode (dropout) or the data?
Loss of one checkpoint on the same batches of train and valid, with dropout on and off."""
import json
import sys
from pathlib import Path

import torch

from runner.config.convert import config_from_dict
from runner.data.batching import collate
from runner.model.loss import label_smoothed_nll
from runner.run import folder
from runner.run.build import build_run

ckpt = Path(sys.argv[1])
nb = int(sys.argv[2]) if len(sys.argv) > 2 else 8
state = folder.load_checkpoint(ckpt)
cfg = config_from_dict(state["config"])
cfg.trainer.device, cfg.trainer.threads = "cpu", 1
parts = build_run(cfg, initialize=False)
parts.model.load_state_dict(state["model"])
pad, eos = parts.pad, parts.eos
out = {}
splits = (("train", parts.train_split, parts.batches), ("valid", parts.valid_split, parts.valid_batches))
for split_name, split, batches in splits:
    for mode in ("eval", "train"):
        torch.manual_seed(0)
        parts.model.train(mode == "train")
        ls = n = 0.0
        with torch.no_grad():
            for idx in batches[:nb]:
                b = collate(split, idx, pad, eos)
                logits = parts.model(b.src_tokens, b.prev_tokens, b.src_has_pad)
                loss, nll = label_smoothed_nll(logits, b.target, cfg.trainer.label_smoothing, pad)
                ls += float(loss)
                n += b.ntokens
        out[f"{split_name}/{mode}"] = ls / n
print(json.dumps({"checkpoint": str(ckpt), "batches": nb, "loss_per_token": out}, indent=1))
