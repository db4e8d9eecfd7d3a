"""A stand-in task for sweep tests: composes deepinit's real config (conf/, presets, launchers)
but, instead of training, writes what a run folder would hold (PROBE_MODE=fake_train) or records
the environment the launcher gave it (PROBE_MODE=probe). Used by tests/sweep/test_report.py,
test_local_launcher.py and test_slurm.py so they exercise Hydra and the launchers for real
without depending on training speed."""
import json
import math
import os
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig

from runner.cli.compose import register_schemas

register_schemas()
CONF = str(Path(__file__).resolve().parents[1] / "conf")


def fake_train(cfg, out: Path) -> None:
    """Loss surface with a known optimum (lr 3e-4, beta2 0.99); lr >= 4e-4 with beta2 0.999
    diverges, like Post-LN's corner of the Admin grid."""
    lr, beta2 = cfg.optim.lr, cfg.optim.beta2
    diverged = lr >= 4e-4 and beta2 >= 0.999
    final = 3.0 + 1000 * abs(lr - 3e-4) + 10 * (beta2 - 0.99) + 0.1 * cfg.model.layers / 6
    steps = cfg.trainer.max_updates
    with open(out / "metrics.jsonl", "w") as f:
        for step in range(10, steps + 1, 10):
            loss = float("nan") if diverged and step > steps // 2 else final + 5.0 / step
            f.write(json.dumps({"step": step, "loss": loss, "lr": lr, "split": "train"}) + "\n")
            if step % 20 == 0:
                f.write(json.dumps({"step": step, "loss": loss + 0.2, "lr": lr,
                                    "split": "valid"}) + "\n")
    best = None if diverged else final + 0.2 + 5.0 / (steps - steps % 20)
    (out / "result.json").write_text(json.dumps({
        "status": "diverged" if diverged else "ok", "updates": steps // 2 if diverged else steps,
        "train_loss": None if diverged else final + 5.0 / steps,
        "valid_loss": best, "best_valid_loss": best, "wall_s": 12.5, "tokens_per_s": 1000.0,
        "reason": "loss is nan" if diverged else "", "bleu": None if diverged else round(30 - math.log(1 + best), 2),
        "overrides": list(HydraConfig.get().overrides.task)}))


def barrier(folder, parties: int, timeout_s: float = 120.0) -> None:
    """Announce this task in `folder`, then wait until `parties` tasks have: tasks that a test
    expects to run at the same time then overlap however slowly each one starts."""
    if not folder or parties <= 0:
        return
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"started-{os.getpid()}-{time.time_ns()}").touch()
    deadline = time.time() + timeout_s
    while len(list(folder.glob("started-*"))) < parties and time.time() < deadline:
        time.sleep(0.05)


@hydra.main(version_base="1.3", config_path=CONF, config_name="train")
def main(cfg) -> None:
    out = Path(HydraConfig.get().runtime.output_dir)
    mode = os.environ.get("PROBE_MODE", "fake_train")
    if mode == "fake_train":
        fake_train(cfg, out)
    else:
        t0 = time.time()
        barrier(os.environ.get("PROBE_BARRIER_DIR"), int(os.environ.get("PROBE_BARRIER", "0")))
        time.sleep(float(os.environ.get("PROBE_SLEEP", "1.5")))
        (out / "probe.json").write_text(json.dumps({
            "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "start": t0, "end": time.time(),
            "slurm_job": os.environ.get("SLURM_JOB_ID")}))


if __name__ == "__main__":
    main()
