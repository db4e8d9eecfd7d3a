"""SCALE=paper proven to run, not only written (docs/reproductions.md, "Paper scale").

Without a GPU and without the real corpora: a fake IWSLT'14 raw archive in the WIT3 layout (the
one tests/data/test_prepare.py builds) goes through `deepinit data prepare iwslt14`, and a few
hundred BPE'd-looking lines stand in for the prepared WMT'14 En-De folder. Then every cell of every
paper-scale preset composes and passes check_config, and the largest model of each preset (the
most layers; the last such cell in plan order) trains for 2 updates on CPU at its real size through
`deepinit train`, ending in result.json.

What the 2-update runs change, and why: fp32 on CPU (fp16 needs CUDA); a 1-update warmup (a
warmup longer than the run is rejected); validation and checkpoint_last.pt only at the end, no
numbered checkpoints, TensorBoard or test decoding; each update is one micro-batch of at most
MAX_TOKENS tokens (the presets' 4,000-25,000 tokens in 1-4 micro-batches are minutes of one CPU
core per update for the 512-2048-8 models; the compute per token does not depend on the batch,
and accumulation is checked in tests/bench and tests/run). Depth, width, vocabulary sharing,
init, norm placement and optimizer are the preset's. On a 2-core machine the file takes about a
minute with two workers (the 18+18 and 24+24 presets ~15-25 s each with the composition of all
their cells, ~2 s of that writing their 1.6-2.1 GB checkpoint_last.pt, which the test deletes).

Also here: the Lipschitz preset against its paper's recipe, the GPU-hour estimate of the
paper-scale targets (runner/tables/cost.py paper_gpu_hours) against a hand computation, and the
deepest model of each SCALE=gpu preset trained for 2 updates on CPU.
"""
from __future__ import annotations

import importlib.util
import json
import math
import random
import time
from pathlib import Path

import pytest

from runner.run.build import check_config
from runner.sweep.plan import plan_cells
from runner.tables.cost import (
    ASSUMED_UTILIZATION,
    COST_FREE_KEYS,
    H100_PEAK_TFLOPS,
    H100_SECONDS_PER_UPDATE,
    PAPER_CORPORA,
    paper_gpu_hours,
    update_flops,
)
from runner.tables.sweep_tier import paper_problems
from runner.tables.targets import TARGETS
from tests.conftest import REPO, compose, run_cli_here  # compose: kept per overrides for the session

MAX_TOKENS = 64  # tokens per update of the 2-update runs (see above): a few sentences
PAPER_PARTS = [(name, part) for name, t in TARGETS.items() for part in t.parts.get("paper", ())]
PAPER_TARGETS = sorted({name for name, _ in PAPER_PARTS})


def _fake_iwslt_tgz(path: Path) -> Path:
    """tests/data/test_prepare.py's small de-en.tgz in the WIT3 2014-01 layout (46 pairs,
    2 of them cleaned away, the five test sets as XML)."""
    spec = importlib.util.spec_from_file_location(
        "_paper_scale_prepare_helpers", REPO / "tests" / "data" / "test_prepare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._fake_tgz(path)


def _fake_wmt14(folder: Path, sizes=(("train", 300), ("valid", 20), ("test", 20))) -> Path:
    """A prepared, BPE'd WMT'14 En-De folder in miniature: {train,valid,test}.{en,de}, 4-11
    tokens a line with "@@ " subword markers, word i of the English line aligned with word i of
    the German one."""
    rng = random.Random(14)
    en = "the a cat dog house car sees likes finds big small red old new quick@@ ly run@@ s".split()
    de = "der die Katze Hund Haus Auto sieht mag findet gross klein rot alt neu schnell@@ er lauf@@ t".split()
    folder.mkdir(parents=True)
    for split, n in sizes:
        src, tgt = [], []
        for _ in range(n):
            idx = [rng.randrange(len(en)) for _ in range(rng.randint(3, 10))]
            src.append(" ".join(en[i] for i in idx) + " .\n")
            tgt.append(" ".join(de[i] for i in idx) + " .\n")
        (folder / f"{split}.en").write_text("".join(src))
        (folder / f"{split}.de").write_text("".join(tgt))
    return folder


@pytest.fixture(scope="module")
def paper_data(tmp_path_factory) -> dict[str, str]:
    """The data folders the paper-scale presets read, by environment variable."""
    root = tmp_path_factory.mktemp("paper_data")
    raw = _fake_iwslt_tgz(root / "de-en.tgz")
    iwslt = root / "iwslt14"
    proc = run_cli_here(["data", "prepare", "iwslt14", "--raw", str(raw), "--out", str(iwslt)], cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for split in ("train", "valid", "test"):
        for lang in ("de", "en"):
            assert (iwslt / f"{split}.{lang}").stat().st_size > 0
    return {"DEEPINIT_IWSLT14_DIR": str(iwslt), "DEEPINIT_WMT14_DIR": str(_fake_wmt14(root / "wmt14"))}


def _layers(cfg) -> int:
    return cfg.model.num_encoder_layers + cfg.model.num_decoder_layers


@pytest.mark.slow
@pytest.mark.parametrize("target,part", PAPER_PARTS, ids=[p.preset for _, p in PAPER_PARTS])
def test_paper_preset_composes_and_its_largest_cell_trains_2_updates(target, part, paper_data,
                                                                     monkeypatch, tmp_path):
    for k, v in paper_data.items():
        monkeypatch.setenv(k, v)
    assert paper_problems(TARGETS[target], "slurm") == []  # data found; GPU left to slurm
    cells, fixed = plan_cells(part.preset)
    assert cells and not fixed
    largest, largest_cfg = None, None
    for cell in cells:
        axes = [f"{k}={v}" for k, v in cell.items()]
        cfg = compose([f"+sweep={part.preset}", *axes])
        check_config(cfg)
        assert cfg.data.dir == paper_data[part.data_env]
        assert (cfg.data.source_lang, cfg.data.target_lang) == part.data_langs
        if largest_cfg is None or (_layers(cfg), cfg.model.dim) >= (_layers(largest_cfg),
                                                                    largest_cfg.model.dim):
            largest, largest_cfg = axes, cfg

    run_dir = tmp_path / "run"
    overrides = [f"+sweep={part.preset}", *largest, "trainer.max_updates=2", "trainer.device=cpu",
                 "trainer.precision=fp32", "trainer.final_bleu=false", "trainer.valid_interval=0",
                 "trainer.save_interval=0", "trainer.keep_checkpoints=0", "trainer.log_interval=1",
                 "trainer.tensorboard=false", "trainer.progress=false", "warmup.updates=1",
                 "trainer.update_freq=1", f"data.max_tokens={MAX_TOKENS}",
                 f"data.dir={paper_data[part.data_env]}", f"hydra.run.dir={run_dir}"]
    t0 = time.perf_counter()
    proc = run_cli_here(["train", *overrides], cwd=tmp_path)
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    # 2 updates cannot beat the unigram model: "ok" with stalled=true is the expected outcome;
    # "diverged" would also be a finished run, but none did when this was written.
    assert result["status"] in ("ok", "diverged"), result
    assert result["updates"] == 2 and result["device"] == "cpu"
    assert math.isfinite(result["train_loss"])
    assert (run_dir / "checkpoint_last.pt").is_file()
    # the real model size: the trained model has the preset's shape
    env = json.loads((run_dir / "env.json").read_text())
    assert env["parameters"] == result["parameters"] > 0
    init = json.loads((run_dir / "init.json").read_text())
    assert init  # the preset's scheme wrote its report
    m = largest_cfg.model
    log = (run_dir / "train.log").read_text()
    assert f"{m.num_encoder_layers}+{m.num_decoder_layers} layers" in log
    print(f"\n{part.preset} {' '.join(largest)} ({m.num_encoder_layers}+{m.num_decoder_layers} "
          f"layers, {m.dim}-{m.ffn_dim}-{m.heads}, {result['parameters']:,} parameters): "
          f"2 updates, {result['status']}{' (stalled)' if result.get('stalled') else ''}, "
          f"train loss {result['train_loss']:.3f}, {wall:.1f} s wall")
    for ckpt in run_dir.glob("*.pt"):  # up to 2 GB each for the WMT models
        ckpt.unlink()


# ----------------------------------------------------------------------------- the Lipschitz recipe
@pytest.mark.parametrize("order", ["order_v1", "order_v2"])
def test_lipschitz_paper_preset_is_the_papers_recipe(order):
    """Xu et al. 2020, Sec. 2.1: Transformer base with 8k warmup, 25k target tokens per batch,
    beam 4, the last 5 checkpoints (every 1,500 steps) averaged; the rest is Transformer base
    (Vaswani et al. 2017, Sec. 5.2-5.4) as the paper's implementation set it."""
    cfg = compose(["+sweep=reproduce_lipschitz_paper", f"+reproduce={order}", "init=lipschitz",
                   "model.layers=24"])
    check_config(cfg)
    assert (cfg.model.dim, cfg.model.ffn_dim, cfg.model.heads, cfg.model.layers) == (512, 2048, 8, 24)
    assert cfg.data.max_tokens * cfg.trainer.update_freq * cfg.trainer.devices == 25_000
    assert cfg.warmup.updates == 8000 and cfg.warmup.init_lr == 0.0
    assert cfg.schedule.name == "inverse_sqrt"
    # Vaswani et al. Eq. 3 at its peak (step = warmup): d^-0.5 * warmup^-0.5
    assert cfg.optim.lr == pytest.approx(512 ** -0.5 * 8000 ** -0.5, rel=1e-3)
    assert (cfg.optim.name, cfg.optim.beta1, cfg.optim.beta2, cfg.optim.eps) == ("adam", 0.9, 0.98, 1e-9)
    assert cfg.optim.weight_decay == 0.0 and cfg.optim.clip_norm == 0.0
    assert cfg.trainer.label_smoothing == 0.1 and cfg.model.dropout == 0.1
    assert cfg.trainer.max_updates == 100_000
    assert cfg.trainer.save_interval == 1500 and cfg.trainer.keep_checkpoints >= 5
    assert (cfg.trainer.eval_beam, cfg.trainer.eval_lenpen, cfg.trainer.eval_average_last) == (4, 0.0, 5)
    assert cfg.norm.placement == ("post" if order == "order_v1" else "pre")
    part = TARGETS["lipschitz"].parts["paper"][0]
    assert (part.beam, part.lenpen, part.average_last) == (4, 0.0, 5)


# ----------------------------------------------------------------------------- GPU-hours
def test_gpu_hours_of_the_lipschitz_target_by_hand():
    """16 cells of 512-2048-8 at 6/12/18/24 layers (4 cells each), 100k updates of 25k tokens,
    WMT'14 En-De lengths and its 32,768-type joined vocabulary, at 40% of 989.4 TFLOP/s."""
    d, f, vocab = 512, 2048, 32_768
    s, t = 132_886_171 / 4_500_966, 137_628_246 / 4_500_966  # mean en / de tokens per sentence
    flops = 0.0
    for L in (6, 12, 18, 24):
        per_src = L * (4 * d * d + 2 * d * f) + L * 2 * d * d  # self-attn + FFN; cross-attn k, v
        per_tgt = L * (6 * d * d + 2 * d * f) + d * vocab  # self + cross attn, FFN; output layer
        attention = 4 * d * L * (s * s + t * t + s * t)  # scores and values, per sentence
        per_target_token = 3 * (2 * (per_src * s + per_tgt * t) + attention) / t
        flops += 4 * 100_000 * 25_000 * per_target_token
    hours = flops / (989.4e12 * 0.40) / 3600
    assert hours == pytest.approx(21.28, abs=0.01)  # the number docs/reproductions.md gives

    cost = paper_gpu_hours("lipschitz", compose)
    assert cost.cells == 16 and cost.updates == 16 * 100_000 and cost.measured_cells == 0
    assert cost.flops == pytest.approx(flops, rel=1e-9)
    assert cost.gpu_hours == pytest.approx(hours, rel=1e-9)
    assert cost.parts == {"reproduce_lipschitz_paper": (16, pytest.approx(hours, rel=1e-9))}


def test_a_measured_seconds_per_update_replaces_the_flops_estimate(monkeypatch):
    before = paper_gpu_hours("tfixup-depth", compose)
    assert before.cells == 5 and before.measured_cells == 0 and before.gpu_hours > 0
    monkeypatch.setitem(H100_SECONDS_PER_UPDATE, ("reproduce_tfixup_depth_paper", 200), 0.36)
    after = paper_gpu_hours("tfixup-depth", compose)
    assert after.measured_cells == 1
    assert after.gpu_hours == pytest.approx(
        before.gpu_hours - _flop_hours("reproduce_tfixup_depth_paper", "model.layers=200")
        + 50_000 * 0.36 / 3600)


@pytest.mark.slow
def test_every_paper_target_has_a_gpu_hour_estimate():
    composed = []

    def counting_compose(overrides):
        composed.append(overrides)
        return compose(overrides)

    costs = {name: paper_gpu_hours(name, counting_compose) for name in PAPER_TARGETS}
    assert {n: c.cells for n, c in costs.items()} == \
        {"grid": 45, "lipschitz": 16, "table2": 24, "tfixup-depth": 5}
    assert all(c.gpu_hours > 0 and c.measured_cells == 0 for c in costs.values())
    # cells that differ only in seed, lr or beta2 are composed once: the grid's 3 methods, IWSLT'14
    # table2's 3 methods (5 seeds each), every cell of the others
    assert len(composed) == 3 + 16 + 3 + 9 + 5


def test_seed_lr_and_beta2_leave_a_cells_cost_unchanged():
    """What lets paper_gpu_hours compose one Config for the cells that differ only in
    COST_FREE_KEYS: the composed update count and FLOPs per update are the same."""
    def cost(preset, *axes):
        cfg = compose([f"+sweep={preset}", *axes])
        part = next(p for _, p in PAPER_PARTS if p.preset == preset)
        return cfg.trainer.max_updates, update_flops(cfg, PAPER_CORPORA[part.data_env])

    assert COST_FREE_KEYS == {"trainer.seed", "optim.lr", "optim.beta2"}
    assert cost("reproduce_grid_paper", "method=admin", "optim.lr=1e-4", "optim.beta2=0.98") == \
        cost("reproduce_grid_paper", "method=admin", "optim.lr=1e-3", "optim.beta2=0.999")
    assert cost("reproduce_table2_iwslt14", "method=admin", "trainer.seed=1") == \
        cost("reproduce_table2_iwslt14", "method=admin", "trainer.seed=3")


def _flop_hours(preset: str, *axes: str) -> float:
    cfg = compose([f"+sweep={preset}", *axes])
    part = next(p for _, p in PAPER_PARTS if p.preset == preset)
    flops = cfg.trainer.max_updates * update_flops(cfg, PAPER_CORPORA[part.data_env])
    return flops / (H100_PEAK_TFLOPS * 1e12 * ASSUMED_UTILIZATION) / 3600


# ----------------------------------------------------------------------------- the GPU tier
GPU_PARTS = [(name, part) for name, t in TARGETS.items() for part in t.parts.get("gpu", ())]


@pytest.mark.slow
@pytest.mark.parametrize("target,part", GPU_PARTS, ids=[p.preset for _, p in GPU_PARTS])
def test_gpu_tier_preset_trains_2_updates_of_its_deepest_model_on_cpu(target, part, tmp_path):
    """SCALE=gpu's deepest model (18+18 of 512-1024-4; 200+200 of 64-128-2) at its real size,
    through `deepinit train` on CPU: fp32 instead of bf16, the toy corpus instead of Multi30k
    (no corpus needed), 2 updates of MAX_TOKENS tokens."""
    from runner.tables import suite

    first = suite.plan(part.preset)[0]  # the plans list the deepest setting first
    cfg = compose(first.overrides)
    # one cell per arm: an arm's seeds train the same model
    arms = {tuple(sorted(c.arm.items())): c for c in suite.plan(part.preset)}
    deepest = max(compose(c.overrides).model.num_encoder_layers for c in arms.values())
    assert cfg.model.num_encoder_layers == cfg.model.num_decoder_layers == deepest
    run_dir = tmp_path / "run"
    proc = run_cli_here(["train", *first.overrides, "data=toy", "data.toy.train_size=64", "data.toy.valid_size=8",
                         "data.toy.test_size=8", "trainer.max_updates=2", "trainer.device=cpu",
                         "trainer.precision=fp32", "trainer.final_bleu=false", "trainer.valid_interval=0",
                         "trainer.save_interval=0", "trainer.keep_checkpoints=0", "trainer.log_interval=1",
                         "warmup.updates=0", f"data.max_tokens={MAX_TOKENS}", f"hydra.run.dir={run_dir}"],
                        cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["updates"] == 2 and math.isfinite(result["train_loss"])
    assert result["seconds_per_update"] > 0 and result["peak_memory_mb"] is None  # CPU: no CUDA peak
    m = cfg.model
    assert f"{m.num_encoder_layers}+{m.num_decoder_layers} layers" in (run_dir / "train.log").read_text()
    for ckpt in run_dir.glob("*.pt"):
        ckpt.unlink()
