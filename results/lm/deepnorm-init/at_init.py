"""DeepNorm's 24-layer LM at initialization against Post-LN's: how often the untrained model's top
logit is the current input token, and its next-token loss, on the first 16 training blocks."""
import json, platform, subprocess, torch, torch.nn.functional as F
from runner.cli.compose import compose
from runner.run.build import build_run
out = {"commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
       "torch": torch.__version__, "machine": platform.processor() or platform.machine(), "seed": 1, "arms": {}}
arms = {m: [f"method={m}"] for m in ("deepnorm", "post_ln", "pre_ln")}
arms["deepnorm, untied output"] = ["method=deepnorm", "model.share_embeddings=none"]
for name, arm in arms.items():
    overrides = ["+sweep=reproduce_lm_real", *arm, "model.layers=24", "warmup.updates=0", "trainer.seed=1"]
    parts = build_run(compose(overrides))
    model, data = parts.model.eval(), parts.train_split
    x = torch.stack([torch.as_tensor(data[i:i + 64]) for i in range(0, 64 * 16, 64)]).long()
    y = torch.stack([torch.as_tensor(data[i + 1:i + 65]) for i in range(0, 64 * 16, 64)]).long()
    with torch.no_grad():
        logits = model(x)
    out["arms"][name] = {"overrides": overrides,
                           "top_logit_is_current_token": (logits.argmax(-1) == x).float().mean().item(),
                           "loss_nats": F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item(),
                           "vocab": logits.shape[-1]}
print(json.dumps(out, indent=1))
