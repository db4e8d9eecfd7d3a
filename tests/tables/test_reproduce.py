"""`make reproduce-*` (runner/tables/reproduce.py): the plans, the presets, the tables on synthetic run
folders, the paper-scale refusal, and one real cell end to end (resumed as a no-op)."""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from runner.cli.reproduce import main as reproduce_main
from runner.run.build import check_config
from runner.run.hardware import gpu_visible
from runner.sweep.plan import canonical, load_preset, plan_cells
from runner.tables.plan import RECORD_UNTIMED_S, Outcome, collect, estimate_cell_s, real_suite
from runner.tables.pool import estimate_wall_s
from runner.tables.real_tier import real_tier_status
from runner.tables.render import render_lipschitz, render_table2, render_tfixup_depth, write_outputs
from runner.tables.targets import TARGETS
from tests.conftest import REPO, compose, run_cli_here

PAPER_ENV = {"DEEPINIT_IWSLT14_DIR": "/nonexistent/iwslt", "DEEPINIT_WMT14_DIR": "/nonexistent/wmt"}


def fake_cell(root: Path, preset: str, axes: dict, result: dict, fixed=(), sweep=None) -> Path:
    """A run folder as the trainer leaves it, as far as the driver and the report read it."""
    overrides = [*(f"{k}={v}" for k, v in axes.items()), f"+sweep={preset}", *fixed]
    d = root / ",".join(o.lstrip("+") for o in overrides).replace("/", "_")
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    if sweep:
        (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"sweep": sweep}))
    (d / "result.json").write_text(json.dumps(result))
    return d


def ok(loss: float, bleu=None, wall=10.0) -> dict:
    r = {"status": "ok", "best_valid_loss": loss, "valid_loss": loss, "updates": 1000, "wall_s": wall}
    if bleu is not None:
        r["bleu"] = bleu
    return r


DIVERGED = {"status": "diverged", "reason": "non-finite loss", "diverged_step": 37, "updates": 37,
            "wall_s": 3.0}


# ----------------------------------------------------------------------------- plans
@pytest.mark.parametrize("target,scale,counts", [
    ("table2", "cpu", [9]), ("table2", "paper", [15, 9]), ("grid", "cpu", [45]),
    ("grid", "paper", [45]), ("tfixup-depth", "cpu", [5]), ("tfixup-depth", "paper", [5]),
    ("lipschitz", "cpu", [16]), ("lipschitz", "paper", [16])])
def test_plans_have_the_papers_cells(target, scale, counts):
    parts = TARGETS[target].parts[scale]
    assert [len(plan_cells(p.preset)[0]) for p in parts] == counts


def test_plan_values_are_what_hydra_records_and_overrides_replace_axes():
    cells, fixed = plan_cells("reproduce_grid_cpu")
    assert {c["optim.lr"] for c in cells} == {"0.001", "0.002", "0.003", "0.004", "0.005"}
    assert {c["method"] for c in cells} == {"post_ln", "pre_ln", "admin"} and fixed == []
    cells, fixed = plan_cells("reproduce_tfixup_depth_cpu",
                                 ["model.layers=6,20", "optim.lr=1e-3", "hydra.verbose=true"])
    assert [c["model.layers"] for c in cells] == ["6", "20"]
    assert fixed == ["optim.lr=0.001"]
    # overrides that do not change a result (threads, progress, hydra.*) do not make another cell
    cells2, fixed2 = plan_cells("reproduce_tfixup_depth_cpu",
                                   ["model.layers=6,20", "optim.lr=1e-3", "trainer.threads=2"])
    assert (cells2, fixed2) == (cells, fixed)
    assert canonical(["+sweep=x", "model.layers=6", "trainer.progress=false"]) == \
        frozenset({"+sweep=x", "model.layers=6"})
    cells, _ = plan_cells("reproduce_table2_iwslt14")
    assert sorted({c["trainer.seed"] for c in cells}) == ["1111", "2222", "3333", "4444", "5555"]


def test_wall_time_estimate_packs_cells_into_slots():
    assert estimate_wall_s([10, 10, 10, 10], 2) == 20
    assert estimate_wall_s([30, 10, 10, 10], 2) == 30
    assert estimate_wall_s([5, 5], 1) == 10
    # the CPU targets are designed to fit in an hour on two cores (docs/reproductions.md)
    for name, target in TARGETS.items():
        for part in target.parts.get("cpu", ()):
            cells, fixed = plan_cells(part.preset)
            costs = [estimate_cell_s(part.preset, c, fixed) for c in cells]
            assert estimate_wall_s(costs, 2) < 50 * 60, name


# Suites over 6 h, each for the reason its preset's header gives: the grid's minutes per cell are
# its measured pace, which came out over 6 h once its 90 cells had run (planned 5.6 h); Table 2's
# seeds 4-10 of two arms (the power analysis's 10 pairs, 14 more cells) and the width, trained-flat
# and language-model suites are planned over several sittings, with their CPU-hours stated.
OVER_SIX_HOURS = {"grid": 6.6 * 3600, "table2": 18 * 32 * 60, "width": 18 * 70 * 60,
                  "table2-converged": 5 * 240 * 60,
                  "lm": 33 * 26 * 60}  # rounds of 2 cells at their stated minutes (lm: 60 + 3 + 3 added)


def test_real_tiers_fit_six_hours_and_their_claims_parse():
    """Every real-data suite is planned within 6 h of wall time on 2 cores (its preset's stated
    minutes per cell) but those listed with their reasons, and every claim in it is a valid rule
    naming arms the suite trains."""
    from runner.tables import suite
    from runner.tables.claims import claim_from_dict, selector_matches

    for name, target in TARGETS.items():
        for part in target.parts.get("real", ()):
            cells = suite.plan(part.preset)
            sweep = load_preset(part.preset)["sweep"]
            limit = OVER_SIX_HOURS.get(name, 6 * 3600)
            assert estimate_wall_s([sweep["cpu_minutes_per_cell"] * 60] * len(cells), 2) <= limit, name
            arms = [c.arm for c in cells]
            assert len({c.seed for c in cells}) >= 2, name
            for raw in sweep.get("claims", []):
                claim = claim_from_dict(raw)
                for selector in (claim.a, claim.b or {}):
                    assert any(selector_matches(arm, selector) for arm in arms), (name, claim.id, selector)
                    for k, values in selector.items():  # each value of a list names a trained arm
                        for v in values if isinstance(values, tuple) else (values,):
                            assert any(arm.get(k) == v for arm in arms), (name, claim.id, k, v)


def test_gpu_tiers_claims_name_arms_they_train():
    from runner.tables import suite
    from runner.tables.claims import claim_from_dict, selector_matches

    gpu = [(name, part) for name, t in TARGETS.items() for part in t.parts.get("gpu", ())]
    assert sorted(name for name, _ in gpu) == ["table2", "tfixup-depth", "width"]
    for name, part in gpu:
        cells = suite.plan(part.preset)
        sweep = load_preset(part.preset)["sweep"]
        assert sweep["gpu_minutes_per_cell"] > 0 and len({c.seed for c in cells}) >= 2, name
        for raw in sweep["claims"]:
            claim = claim_from_dict(raw)
            for selector in (claim.a, claim.b or {}):
                assert any(selector_matches(c.arm, selector) for c in cells), (name, claim.id, selector)
    # the papers' sizes: 512-1024-4 at 6+6 and 18+18; the 64-128-2 model at 200+200
    table2 = {tuple(c.arm.items()) for c in suite.plan("reproduce_table2_gpu")}
    assert len(table2) == 14 and len(suite.plan("reproduce_table2_gpu")) == 28
    cfg = compose(suite.plan("reproduce_table2_gpu")[0].overrides)
    assert (cfg.model.dim, cfg.model.ffn_dim, cfg.model.heads, cfg.model.num_encoder_layers) == (512, 1024, 4, 18)
    assert cfg.trainer.device == "cuda" and cfg.trainer.precision == "bf16"
    deepest = compose(suite.plan("reproduce_tfixup_depth_gpu")[0].overrides)
    assert (deepest.model.dim, deepest.model.ffn_dim, deepest.model.heads) == (64, 128, 2)
    assert deepest.model.num_encoder_layers == deepest.model.num_decoder_layers == 200
    assert deepest.trainer.max_updates == 2000 and deepest.warmup.updates == 0
    # width at 512: the CPU tier's recipe with only the width and the device changed
    width = suite.plan("reproduce_width_gpu")
    assert len(width) == 24 and len({tuple(c.arm.items()) for c in width}) == 8

    def settings(cell) -> dict:
        def flat(node, prefix=""):
            for k, v in node.items():
                yield from flat(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]
        return {k: v for k, v in flat(dataclasses.asdict(compose(cell.overrides))) if not k.startswith("sweep.")}

    arm = {"method": "post_ln", "model.layers": "12", "optim.lr": "0.001"}
    gpu_cell = next(c for c in width if c.arm == arm)
    cpu_cell = next(c for c in suite.plan("reproduce_width_real")
                    if c.arm == {**arm, "model.dim": "128", "model.ffn_dim": "256", "model.heads": "4"})
    gpu_settings, cpu_settings = settings(gpu_cell), settings(cpu_cell)
    changed = {k for k in gpu_settings if gpu_settings[k] != cpu_settings[k]}
    assert changed == {"model.dim", "model.ffn_dim", "trainer.device", "trainer.threads"}, changed
    assert (gpu_settings["model.dim"], gpu_settings["model.ffn_dim"], gpu_settings["model.heads"]) == (512, 1024, 4)
    assert gpu_settings["trainer.precision"] == "fp32" and gpu_settings["trainer.device"] == "cuda"


@pytest.fixture(scope="module")
def composed_arms() -> dict:
    """{(preset, arm): (cell, (config, group choices, task overrides))} of the first cell of every
    arm of every real- and gpu-tier suite, composed once for the tests that read them. Arms that
    differ only in their learning rate (70 of the 180; a Hydra compose is ~0.2 s) are composed
    once, at their smallest lr: check_config reads the lr only in lower bounds on it (min_lr and
    the warmup's initial lr must not exceed it), which the smallest lr meets if any does."""
    from runner.cli.compose import compose_run
    from runner.tables import suite

    def lr(cell) -> float:
        return float(cell.arm.get("optim.lr", "inf"))

    firsts = {}
    for target in TARGETS.values():
        for part in (*target.parts.get("real", ()), *target.parts.get("gpu", ())):
            for cell in suite.plan(part.preset):
                key = (part.preset, tuple((k, v) for k, v in cell.arm.items() if k != "optim.lr"))
                if key not in firsts or lr(cell) < lr(firsts[key]):
                    firsts[key] = cell
    return {key: (cell, compose_run(cell.overrides)) for key, cell in firsts.items()}


def test_every_real_tier_arm_composes_and_validates(composed_arms):
    assert len({preset for preset, _ in composed_arms}) > 15  # every suite's, not a few
    for cell, (cfg, _, _) in composed_arms.values():
        check_config(copy.deepcopy(cfg))  # it fills in what the config leaves to the run


def _method_settings(method: str) -> tuple[dict[str, str], dict[str, object]]:
    """conf/method/<method>.yaml as (group -> option of its `override /group: option` defaults,
    dotted key -> value of its body)."""
    from omegaconf import OmegaConf

    from runner.cli.train import method_group_options

    raw = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "method" / f"{method}.yaml"))
    groups = method_group_options(raw.pop("defaults", []))

    def flat(node, prefix=""):
        for k, v in node.items():
            yield from flat(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]
    return groups, dict(flat(raw))


def test_every_suite_arm_trains_the_method_it_names(composed_arms):
    """A preset's own defaults and values are merged after the method's: a preset that overrides a
    group or key that an arm's method sets would silently train another method (a preset's
    `override /optim: adam` once turned method=post_ln_sgd into Post-LN with Adam)."""
    from omegaconf import OmegaConf

    from runner.cli.compose import compose_run

    # what the chosen groups' options say the method is: a preset that set one of these (say
    # optim.name: adam) would change the method without changing the group choice
    identity = ("optim.name", "optim.momentum", "norm.placement", "norm.decoder_placement", "norm.kind",
                "norm.embedding_norm", "init.name")
    checked, alone_by_method, seen = 0, {}, set()
    for (preset, _), (cell, (cfg, choices, _)) in composed_arms.items():
        method = cell.arm.get("method")
        if method is None or (preset, method) in seen:
            continue
        seen.add((preset, method))
        groups, values = _method_settings(method)
        for group, option in groups.items():
            assert choices[group] == option, (preset, method, group, choices[group])
        composed = OmegaConf.structured(cfg)
        for key, value in values.items():
            assert OmegaConf.select(composed, key) == value, (preset, method, key)
        if method not in alone_by_method:
            alone_by_method[method] = OmegaConf.structured(compose_run([f"method={method}"])[0])
        alone = alone_by_method[method]
        for key in identity:
            if key.split(".")[0] in groups:
                assert OmegaConf.select(composed, key) == OmegaConf.select(alone, key), (preset, method, key)
        checked += 1
    assert checked > 40  # every method arm of every suite, not a selection that matched nothing


# ----------------------------------------------------------------------------- presets
@pytest.mark.parametrize("preset,axes,expect", [
    ("reproduce_table2_cpu", {"method": "post_ln", "model.layers": "18"},
     {"norm.placement": "post", "warmup.updates": 0, "optim.name": "adam", "optim.lr": 1e-3,
      "data.name": "toy", "model.dim": 64, "model.layers": 18, "trainer.max_updates": 500}),
    ("reproduce_table2_cpu", {"method": "admin", "model.layers": "6"},
     {"init.name": "admin", "norm.placement": "post"}),
    ("reproduce_grid_cpu", {"method": "pre_ln", "optim.beta2": "0.995", "optim.lr": "3e-3"},
     {"optim.name": "radam", "schedule.name": "linear", "warmup.updates": 0, "optim.beta2": 0.995,
      "norm.placement": "pre", "model.layers": 12, "optim.lr": 3e-3}),
    ("reproduce_tfixup_depth_cpu", {"model.layers": "200"},
     {"init.name": "tfixup", "norm.placement": "none", "warmup.updates": 0, "model.ffn_dim": 128}),
    ("reproduce_lipschitz_cpu", {"+reproduce": "order_v1", "init": "lipschitz", "model.layers": "24"},
     {"norm.placement": "post", "norm.embedding_norm": True, "init.name": "lipschitz",
      "warmup.updates": 200, "data.max_tokens": 1024, "trainer.max_updates": 600}),
    ("reproduce_lipschitz_cpu", {"+reproduce": "order_v2", "init": "xavier", "model.layers": "12"},
     {"norm.placement": "pre", "norm.embedding_norm": False}),
    # paper recipes: Transformer-Clinic nmt-experiments/iwslt14_de-en.md (IWSLT, and the no-warmup grid),
    # nmt-experiments/wmt14_en-de.md (WMT'14); layer6ai-labs/T-Fixup Train_IWSLT_TFixup_example.sh (T-Fixup)
    ("reproduce_table2_iwslt14", {"method": "pre_ln", "trainer.seed": "3333"},
     {"model.dim": 512, "model.ffn_dim": 1024, "optim.lr": 7e-4, "warmup.updates": 6000,
      "warmup.init_lr": 1e-7, "model.dropout": 0.3, "trainer.max_updates": 100000,
      "data.dir": "/nonexistent/iwslt", "trainer.keep_checkpoints": 10}),
    ("reproduce_table2_wmt14", {"method": "admin", "model.layers": "18"},
     {"model.dim": 512, "model.ffn_dim": 2048, "optim.lr": 1e-3, "warmup.updates": 8000,
      "data.source_lang": "en", "data.target_lang": "de", "data.max_tokens": 8192,
      "trainer.update_freq": 4}),
    ("reproduce_grid_paper", {"method": "admin", "optim.beta2": "0.99", "optim.lr": "5e-4"},
     {"optim.name": "radam", "schedule.name": "linear", "warmup.updates": 0, "schedule.min_lr": 0.0,
      "trainer.max_updates": 100000}),
    # QK-norm in its paper's setting (Henry et al. 2020; QKN QKNorm/configurations.py: pre_act,
    # fix_norm, mha_sup), g0 = log2(L^2 - L) with L = 27 for Multi30k
    ("reproduce_schemes_scaling_real", {"method": "qk_norm"},
     {"norm.placement": "pre", "model.fixnorm": True, "model.qk_norm": "l2", "warmup.updates": 0,
      "model.qk_norm_temperature": round(math.log2(27 ** 2 - 27), 3)}),
    ("reproduce_schemes_scaling_warmup_real", {"method": "qk_norm"},
     {"norm.placement": "pre", "model.fixnorm": True, "model.qk_norm": "l2", "warmup.updates": 500}),
    ("reproduce_tfixup_depth_paper", {"model.layers": "100"},
     {"optim.lr": 5e-4, "optim.clip_norm": 25.0, "model.share_embeddings": "decoder_io",
      "trainer.max_updates": 50000}),
])
def test_preset_cells_compose_validate_and_follow_the_recipe(monkeypatch, preset, axes, expect):
    for k, v in PAPER_ENV.items():
        monkeypatch.setenv(k, v)
    cfg = compose([f"+sweep={preset}", *(f"{k}={v}" for k, v in axes.items())])
    check_config(cfg)
    for dotted, want in expect.items():
        node = cfg
        for part in dotted.split("."):
            node = getattr(node, part)
        assert node == want, dotted


# ----------------------------------------------------------------------------- tables
def _table2_cpu(root: Path) -> None:
    losses = {"post_ln": {6: 2.10, 12: 2.40}, "pre_ln": {6: 2.20, 12: 2.30, 18: 2.35},
              "admin": {6: 2.05, 12: 2.20, 18: 2.25}}
    for m, by_depth in losses.items():
        for L in (6, 12, 18):
            res = ok(by_depth[L], bleu=40.0 + L) if L in by_depth else DIVERGED
            fake_cell(root, "reproduce_table2_cpu", {"method": m, "model.layers": L}, res)


def _row(text: str, start: str) -> list[str]:
    line = next(ln for ln in text.splitlines() if ln.startswith(f"| {start}"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_table2_cpu_layout_paper_numbers_and_failed(tmp_path):
    _table2_cpu(tmp_path)
    part = TARGETS["table2"].parts["cpu"][0]
    out = Outcome("table2", "cpu", {"": collect(part, tmp_path)}, tmp_path)
    path = write_outputs(out, "best_valid_loss")
    text = path.read_text()
    assert path == tmp_path / "reproduction.md"
    assert _row(text, "setting")[1:] == ["Post-LN (paper)", "Post-LN (ours)", "Pre-LN (paper)",
                                         "Pre-LN (ours)", "Admin (paper)", "Admin (ours)"]
    assert _row(text, "toy 6L")[1:] == ["27.80", "2.100 loss, 46.0 BLEU", "27.27",
                                        "2.200 loss, 46.0 BLEU", "27.90", "2.050 loss, 46.0 BLEU"]
    r18 = _row(text, "toy 18L")
    assert "WMT'14 En-De, 18L-18L base" in r18[0]
    assert r18[1:] == ["failed", "failed (diverged @37)", "28.38", "2.350 loss, 58.0 BLEU", "29.03",
                       "2.250 loss, 58.0 BLEU"]
    assert _row(text, "toy 12L")[1] == "failed" and _row(text, "toy 12L")[2].startswith("2.400")
    assert "- Post-LN fails at 18 layers: yes" in text
    assert "- Pre-LN trains at every depth: yes" in text
    assert "- Admin at least as good as Pre-LN (best_valid_loss), at every depth both trained: yes" in text
    assert "9 cells: 8 ok, 1 diverged" in text


def test_a_stalled_cell_counts_as_failed(tmp_path):
    """A run that finished at the unigram plateau (result.json stalled) is a failure to train."""
    losses = {"post_ln": {6: 2.10}, "pre_ln": {6: 2.20, 18: 2.35}, "admin": {6: 2.05, 18: 2.25}}
    for m in ("post_ln", "pre_ln", "admin"):
        for L in (6, 18):
            res = ok(losses[m][L]) if L in losses[m] else {**ok(4.39), "stalled": True}
            fake_cell(tmp_path, "reproduce_table2_cpu", {"method": m, "model.layers": L}, res)
    part = TARGETS["table2"].parts["cpu"][0]
    out = Outcome("table2", "cpu", {"": collect(part, tmp_path)}, tmp_path)
    text = write_outputs(out, "best_valid_loss").read_text()
    assert _row(text, "toy 18L")[2] == "failed (stalled)"
    assert "- Post-LN fails at 18 layers: yes" in text
    assert "1 stalled" in text


def test_table2_pending_cells_and_unknown_checks(tmp_path):
    fake_cell(tmp_path, "reproduce_table2_cpu", {"method": "pre_ln", "model.layers": 6}, ok(2.0))
    part = TARGETS["table2"].parts["cpu"][0]
    cells = collect(part, tmp_path)
    assert sum(c.status == "pending" for c in cells) == 8
    text = render_table2(Outcome("table2", "cpu", {"": cells}, tmp_path))
    assert _row(text, "toy 18L")[2] == "pending"
    assert "- Post-LN fails at 18 layers: n/a" in text


def test_table2_paper_seeds_mean_std(tmp_path):
    iw, wmt = tmp_path / "iwslt14", tmp_path / "wmt14"
    for m, base in (("post_ln", 35.0), ("pre_ln", 34.0), ("admin", 35.5)):
        for i, seed in enumerate((1111, 2222, 3333, 4444, 5555)):
            res = DIVERGED if (m == "post_ln" and seed == 5555) else ok(3.9, bleu=base + 0.1 * i)
            fake_cell(iw, "reproduce_table2_iwslt14", {"method": m, "trainer.seed": seed}, res)
    for m in ("post_ln", "pre_ln", "admin"):
        for L in (6, 12, 18):
            res = DIVERGED if (m == "post_ln" and L > 6) else ok(4.0, bleu=27.0 + L / 10)
            fake_cell(wmt, "reproduce_table2_wmt14", {"method": m, "model.layers": L}, res)
    parts = TARGETS["table2"].parts["paper"]
    out = Outcome("table2", "paper", {p.sub: collect(p, tmp_path / p.sub) for p in parts}, tmp_path)
    text = render_table2(out)
    iwslt = _row(text, "IWSLT'14 De-En, 6L-6L small")
    assert iwslt[1] == "35.64 ± 0.23"
    assert iwslt[2] == "35.15 ± 0.13 BLEU, 3.900 loss (1/5 failed)"
    assert iwslt[4] == "34.20 ± 0.16 BLEU, 3.900 loss"
    assert _row(text, "WMT'14 En-Fr, 60L-12L base")[2] == "not run (no En-Fr recipe)"
    assert _row(text, "WMT'14 En-De, 18L-18L base")[1:3] == ["failed", "failed (diverged @37)"]
    assert _row(text, "WMT'14 En-De, 6L-6L base")[6] == "27.60 BLEU, 4.000 loss"


def test_grid_counts_heatmaps_and_paper_counts(tmp_path):
    part = TARGETS["grid"].parts["cpu"][0]
    sweep = {"name": "reproduce_grid_cpu", "scientific": ["method"],
             "nuisance": ["optim.lr", "optim.beta2"]}
    cells, _ = plan_cells(part.preset)
    lrs = sorted({float(c["optim.lr"]) for c in cells})
    assert len(lrs) == 5
    post_failed = 0
    for c in cells:
        lr, b2 = float(c["optim.lr"]), float(c["optim.beta2"])
        rank = lrs.index(lr)  # 0..4, whatever the preset's learning rates
        if c["method"] == "post_ln" and rank >= 2 and (rank > 2 or b2 == 0.999) and post_failed < 7:
            res = DIVERGED
            post_failed += 1
        elif c["method"] == "post_ln" and rank == 2 and b2 == 0.995:
            res = {**ok(4.3), "stalled": True}
        elif c["method"] == "pre_ln" and rank == 0 and b2 == 0.99:
            res = {**ok(4.4), "stalled": True}  # ended at the unigram plateau
        else:
            res = ok({"post_ln": 3.0, "pre_ln": 3.2, "admin": 3.1}[c["method"]] - rank / 10)
        fake_cell(tmp_path, part.preset, c, res, sweep=sweep)
    assert post_failed == 7
    out = Outcome("grid", "cpu", {"": collect(part, tmp_path)}, tmp_path)
    text = write_outputs(out, "best_valid_loss").read_text()
    # diverged, stalled, paper; "better than Pre-LN" only where the Pre-LN twin is ok
    assert _row(text, "Post-LN")[1:5] == ["7/15", "1/15", "7/15", "6 of 7 converged"]
    assert _row(text, "Pre-LN")[1:4] == ["0/15", "1/15", "0/15"]
    assert _row(text, "Admin")[1:5] == ["0/15", "0/15", "0/15", "14 of 15 converged"]
    pre_block = text.split("### Pre-LN")[1].split("###")[0]
    assert "stalled 4.400" in pre_block
    assert "- Pre-LN converges in every cell: no" in text
    post_block = text.split("### Post-LN")[1].split("###")[0]
    assert post_block.count("failed") - post_block.count('"failed"') == 7
    assert "- Post-LN diverges in several cells (2 or more): yes" in text
    assert "- Post-LN fails (diverges or stalls) in several cells (2 or more): yes" in text
    assert "- Admin converges in every cell: yes" in text
    assert len(list(tmp_path.glob("heatmap*.png"))) == 3
    assert "![heatmap_method=admin](heatmap_method=admin.png)" in text


def test_tfixup_and_lipschitz_layouts(tmp_path):
    t = tmp_path / "t"
    for L in (6, 20, 50, 100, 200):
        fake_cell(t, "reproduce_tfixup_depth_cpu", {"model.layers": L},
                  DIVERGED if L == 200 else ok(3.0 - L / 100))
    part = TARGETS["tfixup-depth"].parts["cpu"][0]
    text = render_tfixup_depth(Outcome("tfixup-depth", "cpu", {"": collect(part, t)}, t))
    assert _row(text, "50L-50L")[1:3] == ["29.28", "2.500 loss"]
    assert _row(text, "200L-200L")[1:3] == ["27.65", "failed (diverged @37)"]
    assert "- T-Fixup trains at every depth: no" in text

    lp = tmp_path / "l"
    part = TARGETS["lipschitz"].parts["cpu"][0]
    for c in plan_cells(part.preset)[0]:
        bad = c["+reproduce"] == "order_v1" and c["init"] == "xavier" and c["model.layers"] != "6"
        fake_cell(lp, part.preset, c, DIVERGED if bad else ok(2.0))
    text = render_lipschitz(Outcome("lipschitz", "cpu", {"": collect(part, lp)}, lp))
    assert _row(text, "layers")[1:5] == ["v1 (Post-LN) (paper)", "v1 (Post-LN) (ours)",
                                         "v1-L (paper)", "v1-L (ours)"]
    assert _row(text, "12L-12L")[1:5] == ["failed", "failed (diverged @37)", "28.67", "2.000 loss"]
    assert _row(text, "24L-24L")[7:9] == ["29.20", "2.000 loss"]
    assert "- v1 (Post-LN) without Lipschitz init fails at 12+ layers: yes" in text
    assert "- v1 with Lipschitz init trains at every depth: yes" in text


# ----------------------------------------------------------------------------- commands
MAKE_DRY_RUNS = [
    ("table2", 9, "method=admin model.layers=18"),
    ("grid", 45, "method=post_ln optim.beta2=0.999 optim.lr=0.005"),
    ("tfixup-depth", 5, "model.layers=200"),
    ("lipschitz", 16, "model.layers=24 reproduce=order_v1 init=lipschitz"),
]


@pytest.fixture(scope="module")
def make_dry_runs(tmp_path_factory) -> dict:
    """`make -s reproduce-TARGET SCALE=cpu DRY_RUN=1 REPRODUCE_ARGS=--out FOLDER` for each target,
    each in its own folder, as many at once as there are CPU cores: {TARGET: (FOLDER, process)}."""
    from concurrent.futures import ThreadPoolExecutor

    folders = {target: tmp_path_factory.mktemp("make_dry_run") for target, _, _ in MAKE_DRY_RUNS}

    def make(target):
        return subprocess.run(["make", "-s", f"reproduce-{target}", "SCALE=cpu", "DRY_RUN=1",
                               f"REPRODUCE_ARGS=--out {folders[target]}"], cwd=REPO, capture_output=True,
                              text=True, timeout=120)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        procs = dict(zip(folders, pool.map(make, folders)))
    return {target: (folders[target], procs[target]) for target in folders}


@pytest.mark.parametrize("target,cells,sample", MAKE_DRY_RUNS)
def test_make_dry_run_lists_the_cells(make_dry_runs, target, cells, sample):
    tmp_path, proc = make_dry_runs[target]
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.endswith("[pending]")]
    assert len(lines) == cells
    assert any(ln.strip().startswith(sample + " ") for ln in lines)
    assert f"hydra.sweep.dir={tmp_path}/{target}-cpu" in proc.stdout
    assert "estimated wall time" in proc.stdout
    assert not any(tmp_path.iterdir())  # a plan runs nothing


def test_paper_scale_without_data_exits_2(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("DEEPINIT_IWSLT14_DIR", raising=False)
    (tmp_path / "wmt").mkdir()
    (tmp_path / "wmt" / "train.en").write_text("x\n")
    monkeypatch.setenv("DEEPINIT_WMT14_DIR", str(tmp_path / "wmt"))
    rc = reproduce_main(["table2", "--scale", "paper", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "DEEPINIT_IWSLT14_DIR is not set" in err
    assert "has no train.de" in err
    assert ("no GPU is visible" in err) == (not gpu_visible())
    assert not (tmp_path / "o").exists()


def test_one_cell_end_to_end_then_resume_is_a_no_op(tmp_path, capsys):
    args = ["table2", "--scale", "cpu", "--launcher", "basic", "--out", str(tmp_path),
            "method=pre_ln", "model.layers=1", "trainer.max_updates=4", "trainer.log_interval=2",
            "trainer.valid_interval=0", "trainer.save_interval=0", "data.toy.train_size=100",
            "data.toy.valid_size=10", "data.toy.test_size=10",
            "trainer.divergence.stall_margin=-1000"]  # 4 updates: never call it stalled
    assert reproduce_main(args) == 0
    out = capsys.readouterr().out
    sweep = tmp_path / "table2-cpu"
    results = list(sweep.glob("*/result.json"))
    assert len(results) == 1
    result = json.loads(results[0].read_text())
    assert result["status"] == "ok" and result["updates"] == 4
    assert result["eval"]["test"]["beam"] == 1 and result["bleu"] is not None
    row = _row((sweep / "reproduction.md").read_text(), "toy 1L")
    assert row[4] == f"{result['best_valid_loss']:.3f} loss, {result['bleu']:.1f} BLEU"
    assert row[2] == "not run" and row[6] == "not run"
    assert "total wall time of this call" in out
    before = results[0].stat().st_mtime_ns
    assert reproduce_main(args) == 0
    out = capsys.readouterr().out
    assert "1 cells, 1 finished" in out and "running 1 unfinished" not in out
    assert results[0].stat().st_mtime_ns == before


def test_status_counts_records_claims_and_time_left(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DEEPINIT_RESULTS", str(tmp_path))
    folder = tmp_path / "table2" / "real"
    folder.mkdir(parents=True)
    lines = []
    for seed, status in ((1, "ok"), (2, "stalled")):
        overrides = ["+sweep=reproduce_table2_real", "method=pre_ln", f"trainer.seed={seed}", "warmup.updates=0"]
        lines.append(json.dumps({"arm": {"method": "pre_ln", "warmup.updates": "0"}, "overrides": overrides,
                                 "seed": seed, "status": status, "bleu": 30.0, "best_valid_loss": 3.2}))
    (folder / "records.jsonl").write_text("\n".join(lines) + "\n")
    rows = {r["target"]: r for r in real_tier_status(parallel=2)}
    table2 = rows["table2"]
    assert (table2["cells"], table2["records"], table2["ok"], table2["stalled"]) == (35, 2, 1, 1)
    # 33 cells of 32 min left, 2 at a time: 17 rounds
    assert table2["remaining_s"] == pytest.approx(17 * 32 * 60)
    assert table2["verdicts"]["incomplete"] == 8  # a partial suite never reads as a result
    assert rows["grid"]["records"] == 0 and rows["grid"]["cells"] == 90
    # the gpu tiers have rows of their own, counted from results/<target>/gpu, one cell at a time
    gpu = rows["table2 (gpu)"]
    assert (gpu["tier"], gpu["cells"], gpu["records"]) == ("gpu", 28, 0)
    assert gpu["remaining_s"] == pytest.approx(28 * 5 * 60)
    assert reproduce_main(["status", "--parallel", "2"]) == 0
    out = capsys.readouterr().out
    assert "table2" in out and "2/35" in out and "8 incomplete" in out
    from runner.console import console
    monkeypatch.setattr(console, "width", 64)  # a narrow terminal: only the claims wrap
    assert reproduce_main(["status", "--parallel", "2"]) == 0
    out = capsys.readouterr().out
    assert "2/35" in out and "0/90" in out and "~6.5 h" in out and "…" not in out
    # a cell stopped at update 1,000 of its 2,000 with a checkpoint in --out's run folders: started,
    # and its time left is half its time past RECORD_UNTIMED_S
    real = real_suite(TARGETS["table2"])
    run_dir = tmp_path / "out" / "table2-real" / real.todo[0].name
    run_dir.mkdir(parents=True)
    (run_dir / "interrupted.json").write_text(json.dumps({"checkpoint": True, "resume_update": 1000}))
    (run_dir / "checkpoint_last.pt").write_bytes(b"")
    assert compose(real.todo[0].overrides).trainer.max_updates == 2000
    table2 = {r["target"]: r for r in real_tier_status(2, tmp_path / "out", compose)}["table2"]
    assert table2["started"] == 1
    assert table2["remaining_s"] == pytest.approx(16 * 32 * 60 + RECORD_UNTIMED_S + (32 * 60 - RECORD_UNTIMED_S) / 2)
    assert rows["table2"]["started"] == 0  # without --out's folders: none
    assert reproduce_main(["status", "--parallel", "2", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out  # a column of its own, still on the narrow terminal
    words = " ".join(out.split())  # the legend wraps at the terminal's width
    assert "+N: N more started, stopped with a checkpoint in" in words and "…" not in out
    row = next(line for line in out.splitlines() if line.split()[:1] == ["table2"])
    assert row.split()[1] == "2/35+1", row


def test_time_left_comes_from_the_records_of_a_cells_arm_else_its_model_shape(tmp_path, monkeypatch, capsys):
    """Width's cells differ ~6x in cost, so one figure per preset misplans: a cell without a record
    is timed by the median record of its arm (other seeds), else by the whole-budget records of
    its model shape (another method, same model.* settings), else by the preset's minutes; only
    records from the same kind of device count, and a record's wall_s gains RECORD_UNTIMED_S."""
    from runner.tables import suite
    from runner.tables.plan import RECORD_UNTIMED_S, real_suite

    monkeypatch.setenv("DEEPINIT_RESULTS", str(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the cells' threads, as the records'
    cells = suite.plan("reproduce_width_real")

    def pick(method, dim, layers, lr, seed):
        return next(c for c in cells if c.arm["method"] == method and c.arm["model.dim"] == dim and
                    c.arm["model.layers"] == layers and c.arm["optim.lr"] == lr and c.seed == seed)

    def record(cell, wall_s, status="ok", device="cpu"):
        return json.dumps({"arm": cell.arm, "overrides": cell.overrides, "seed": cell.seed, "status": status,
                           "best_valid_loss": 4.0, "wall_s": wall_s, "machine": {"device": device, "threads": 1}})

    folder = tmp_path / "width" / "real"
    folder.mkdir(parents=True)
    (folder / "records.jsonl").write_text("\n".join([
        record(pick("post_ln", "256", "6", "0.001", 1), 8000.0),
        record(pick("post_ln", "256", "6", "0.001", 2), 9000.0),
        record(pick("post_ln", "256", "6", "0.001", 3), 1000.0, status="diverged"),  # its arm's third seed
        record(pick("post_ln", "64", "6", "0.001", 1), 1400.0),
        record(pick("post_ln", "64", "6", "0.001", 2), 100.0, device="cuda:0"),  # a GPU's, not a CPU's
    ]) + "\n")
    real = real_suite(TARGETS["width"])
    estimates = {(c.arm["method"], c.arm["model.dim"], c.arm["model.layers"], c.arm["optim.lr"], c.seed): e
                 for c, e in zip(real.todo, real.estimates("cpu"))}
    wide = [e for k, e in estimates.items() if k[:4] == ("pre_ln", "256", "6", "0.001")]
    assert len(wide) == 3 and {e.source for e in wide} == {"shape"}
    # Pre-LN at 256 wide: Post-LN's two whole-budget records there (the diverged one ended early)
    assert {e.seconds for e in wide} == {8500.0 + RECORD_UNTIMED_S}
    # Post-LN at 64 wide, lr 1e-3, seed 3: the one CPU record of its arm (the GPU's is no CPU time)
    narrow = estimates[("post_ln", "64", "6", "0.001", 3)]
    assert narrow.source == "arm" and narrow.seconds == 1400.0 + RECORD_UNTIMED_S
    # 12+12 at 128 wide has no record of its shape: the preset's 70 minutes
    deep = [e for k, e in estimates.items() if k[2] == "12"]
    assert deep and all(e.source == "preset" and e.seconds == 70 * 60 for e in deep)
    assert all(e.source != "arm" or e.seconds >= 1400 for e in estimates.values())
    # on a GPU only the GPU's record times its arm
    on_gpu = dict(zip([c.name for c in real.todo], real.estimates("cuda")))
    assert on_gpu[pick("post_ln", "64", "6", "0.001", 3).name].seconds == 100.0 + RECORD_UNTIMED_S
    assert reproduce_main(["width", "--scale", "real", "--dry-run", "--parallel", "1"]) == 0
    out = capsys.readouterr().out
    # 64 wide at lr 5e-4 (both methods) and Pre-LN at 64 and 256 wide share a recorded shape
    assert ("from records of the same arm for 1, records of the same model shape for 12, the preset's "
            "minutes per cell for 18)") in out
    status = {r["target"]: r for r in real_tier_status(parallel=1)}["width"]
    assert status["remaining_s"] == pytest.approx(sum(e.seconds for e in estimates.values()))
    # the preset's 70 minutes are a CPU's: no GPU estimate comes from them
    assert all(e is None or e.source != "preset" for e in real.estimates("cuda"))
    # a record of 128 wide at 6+6 times the 12+12 cells of that width, scaled by layers
    with open(folder / "records.jsonl", "a") as f:
        f.write(record(pick("post_ln", "128", "6", "0.001", 1), 6000.0) + "\n")
    real = real_suite(TARGETS["width"])
    deep = [e for c, e in zip(real.todo, real.estimates("cpu")) if c.arm["model.layers"] == "12"]
    assert deep and all(e.source == "depth" and e.seconds == pytest.approx((6000.0 + RECORD_UNTIMED_S) * 2)
                        for e in deep)


def test_time_left_prefers_records_timed_at_the_cells_thread_count(tmp_path, monkeypatch, capsys):
    """A cell trained alone on 2 cores gets 2 threads, ~1.6-1.9x faster per update than the 1 each
    of two cells at once: records timed with the thread count the cells will get come first (arm,
    then shape, then depth), and a cell timed only by another count says so."""
    from runner.tables import suite
    from runner.tables.plan import RECORD_UNTIMED_S, describe_estimates, real_suite
    from runner.tables.real_tier import planned_threads

    monkeypatch.setenv("DEEPINIT_RESULTS", str(tmp_path))
    cells = suite.plan("reproduce_width_real")

    def pick(method, dim, layers, lr, seed):
        return next(c for c in cells if c.arm["method"] == method and c.arm["model.dim"] == dim and
                    c.arm["model.layers"] == layers and c.arm["optim.lr"] == lr and c.seed == seed)

    def record(cell, wall_s, threads):
        return json.dumps({"arm": cell.arm, "overrides": cell.overrides, "seed": cell.seed, "status": "ok",
                           "best_valid_loss": 4.0, "wall_s": wall_s,
                           "machine": {"device": "cpu", "threads": threads}})

    folder = tmp_path / "width" / "real"
    folder.mkdir(parents=True)
    (folder / "records.jsonl").write_text("\n".join([
        record(pick("post_ln", "128", "6", "0.001", 1), 6000.0, 1),  # its arm, at 1 thread
        record(pick("pre_ln", "128", "6", "0.001", 1), 2000.0, 2),  # its shape, at 2 threads
        record(pick("post_ln", "256", "6", "0.001", 1), 9000.0, 1),  # 256 wide: 1 thread only
    ]) + "\n")
    real = real_suite(TARGETS["width"])

    def estimate(threads, *arm):
        return dict(zip([c.name for c in real.todo], real.estimates("cpu", threads)))[pick(*arm).name]

    # two threads: the 2-thread record of its shape, not the 1-thread one of its own arm
    two = estimate(2, "post_ln", "128", "6", "0.001", 2)
    assert (two.source, two.seconds, two.threads_matched) == ("shape", 2000.0 + RECORD_UNTIMED_S, True)
    # one thread: its own arm's record; without a count: the arm, as before threads were told apart
    for threads in (1, None):
        one = estimate(threads, "post_ln", "128", "6", "0.001", 2)
        assert (one.source, one.seconds, one.threads_matched) == ("arm", 6000.0 + RECORD_UNTIMED_S, True)
    # 12+12 at 128 wide: the 2-thread 6+6 record scaled by layers, at 2 threads
    deep = estimate(2, "pre_ln", "128", "12", "0.001", 1)
    assert (deep.source, deep.seconds) == ("depth", pytest.approx((2000.0 + RECORD_UNTIMED_S) * 2))
    # 256 wide has 1-thread records only: they time it, marked as another count
    wide = estimate(2, "post_ln", "256", "6", "0.001", 2)
    assert (wide.source, wide.seconds, wide.threads_matched) == ("arm", 9000.0 + RECORD_UNTIMED_S, False)
    assert "records of the same arm timed at another thread count for 2" in describe_estimates(
        real.estimates("cpu", 2))
    # what the plan expects each cell to get: the pool's share, or a user's trainer.threads
    cfg = compose(list(real.todo[0].overrides) + ["trainer.threads=3"])
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert planned_threads(cfg, "cpu", 1, ["trainer.threads=3"]) == 3
    assert planned_threads(cfg, "cuda", 1, []) is None
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert planned_threads(cfg, "cpu", 1, []) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setattr("runner.tables.pool.usable_cores", lambda: 2)
    assert planned_threads(cfg, "cpu", 1, []) == 2
    # `reproduce status` times the cells left the same way, at its --parallel's threads
    status = {r["target"]: r for r in real_tier_status(parallel=1)}["width"]
    assert status["remaining_s"] == pytest.approx(sum(e.seconds for e in real.estimates("cpu", 2)))
    assert status["remaining_s"] != pytest.approx(sum(e.seconds for e in real.estimates("cpu", 1)))
    assert reproduce_main(["width", "--scale", "real", "--dry-run", "--parallel", "1"]) == 0
    # the plan's cells get 2 threads: 256 wide (2 cells left of its arm) has 1-thread records only
    assert "records of the same arm timed at another thread count for 2" in capsys.readouterr().out


def test_an_override_no_cell_can_run_with_is_refused_before_any_cell_starts(tmp_path, monkeypatch, capsys):
    """A value that composes but breaks a rule of the run (trainer.threads=-2) would make every cell
    start, crash and count as failed: the plan checks each cell as a run would and stops in one
    line, exit 2, with no run folder made."""
    monkeypatch.setenv("DEEPINIT_RESULTS", str(tmp_path / "results"))
    out = tmp_path / "out"
    assert reproduce_main(["width", "--scale", "real", "--out", str(out), "trainer.threads=-2"]) == 2
    err = capsys.readouterr().err
    first = real_suite(TARGETS["width"]).todo[0].label
    assert err.strip().splitlines() == [f"deepinit: error: {first}: trainer.threads=-2: expected a value >= 0"]
    assert not (out / "width-real").exists() or not any((out / "width-real").iterdir())
    # an override every cell can run with passes the check (the dry run trains nothing)
    assert reproduce_main(["width", "--scale", "real", "--out", str(out), "--dry-run", "trainer.threads=1"]) == 0


def test_all_plans_every_real_suite_and_rejects_overrides(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DEEPINIT_RESULTS", str(tmp_path))
    assert reproduce_main(["all", "--scale", "real", "--dry-run", "--parallel", "2"]) == 0
    out = capsys.readouterr().out
    # no records in this results folder: 308 cells of the first 12 suites, Table 2's seeds 4-10 of
    # two arms (14), the width scan (36), Table 2 trained flat (9) and the language-model tier (60,
    # and the 3 cells each of its untied DeepNorm and embedding-scaled DyT controls)
    assert "15 suites" in out and "433 cells, 2 at a time" in out
    assert out.index("table2") < out.index("tfixup-depth") < out.index("mup-transfer")
    assert reproduce_main(["all", "--dry-run", "model.layers=6"]) == 2
    assert reproduce_main(["all", "--scale", "cpu", "--dry-run"]) == 2
    assert "only --scale real" in capsys.readouterr().err


def test_all_with_suites_plans_only_those_suites_in_the_order_given(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DEEPINIT_RESULTS", str(tmp_path))
    assert reproduce_main(["all", "--suites", "mup-transfer", "schemes-norms", "mup-transfer",
                           "--dry-run", "--parallel", "2"]) == 0
    out = capsys.readouterr().out
    assert "2 suites" in out and "77 cells, 2 at a time" in out  # 56 + 21, mup-transfer once
    assert out.index("mup-transfer") < out.index("schemes-norms") and "table2" not in out
    assert reproduce_main(["table2", "--suites", "grid", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and "--suites chooses the suites of 'all'" in err


@pytest.mark.slow
def test_sigterm_to_a_cpu_tier_driver_stops_its_sweep_and_a_rerun_finishes_the_cell(tmp_path):
    """`kill PID` of `deepinit reproduce --scale cpu` (SIGTERM to the driver alone): its
    `deepinit -m` child is told at once and stops the cell, none trains on orphaned, the cell is
    marked interrupted, the driver exits 143 with one line saying so; the same command then
    resumes the cell from its checkpoint and finishes it. The cell is frozen (SIGSTOP) from its
    first checkpoint until the launcher's SIGINT waits on it, so it cannot finish first however
    fast the machine trains."""
    import os
    import signal
    import sys
    import time

    from hydra_plugins.deepinit_launcher.processes import alive, descendants
    from tests.process_control import holding_files_under, send, wait_pending

    args = ["-m", "runner.cli", "reproduce", "table2", "--scale", "cpu", "--launcher", "local",
            "--parallel", "1", "--out", str(tmp_path / "out"), "--no-eval", "method=pre_ln",
            "model.layers=1", "data.toy.train_size=200", "data.toy.valid_size=10", "data.toy.test_size=10",
            "trainer.max_updates=40", "trainer.log_interval=10", "trainer.valid_interval=0",
            "trainer.save_interval=20", "trainer.divergence.stall_margin=-1000"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    driver = subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    frozen: set[int] = set()
    try:
        deadline = time.time() + 300
        while time.time() < deadline and driver.poll() is None and not frozen:
            for ckpt in (tmp_path / "out").rglob("checkpoint_last.pt"):
                frozen = holding_files_under(descendants(driver.pid), ckpt.parent)
                send(frozen, signal.SIGSTOP)
            time.sleep(0.05)
        assert frozen and driver.poll() is None, "the sweep ended before it could be stopped"
        tree = descendants(driver.pid)
        driver.send_signal(signal.SIGTERM)
        # no settling for a SIGTERM: the launcher is told at once and passes SIGINT to the cell
        assert wait_pending(frozen, signal.SIGINT, timeout_s=10.0), "the cell was not told to stop"
        send(frozen, signal.SIGCONT)
        _, err = driver.communicate(timeout=180)
    finally:
        send(frozen, signal.SIGCONT)
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    assert driver.returncode == 143, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("deepinit: interrupted (SIGTERM)")
    assert not [p for p in tree if alive(p)], "a process of the sweep outlived its driver"
    (run_dir,) = [p.parent for p in (tmp_path / "out").rglob("checkpoint_last.pt")]
    assert json.loads((run_dir / "interrupted.json").read_text())["status"] == "interrupted"
    assert not (run_dir / "result.json").exists()
    done = run_cli_here(args[2:], cwd=REPO)  # the same command, its driver in this process
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "ok" and result["updates"] == 40 and result["resumed"] is True


def test_last_checkpoint_bleu_verb_checks_its_target_and_folder(tmp_path, monkeypatch, capsys):
    """`deepinit reproduce TARGET --last-checkpoint-bleu [RUN_FOLDERS]`: a real-tier target, its run folders (default
    <out>/TARGET-real); cells without a matching record are left alone and nothing is written."""
    monkeypatch.setenv("DEEPINIT_RESULTS", str(tmp_path / "results"))
    assert reproduce_main(["grid", "--scale", "cpu", "--last-checkpoint-bleu"]) == 2
    assert reproduce_main(["lipschitz", "--last-checkpoint-bleu", str(tmp_path / "none")]) == 2
    assert "no such folder" in capsys.readouterr().err
    cell = tmp_path / "out" / "lipschitz-real" / "cell"
    (cell / ".hydra").mkdir(parents=True)
    (cell / ".hydra" / "overrides.yaml").write_text("- +sweep=reproduce_lipschitz_real\n")
    (cell / "result.json").write_text(json.dumps({"status": "ok", "bleu": 20.0}))
    assert reproduce_main(["lipschitz", "--last-checkpoint-bleu", "--out", str(tmp_path / "out")]) == 0
    assert not (tmp_path / "results" / "lipschitz" / "real" / "last-checkpoint-bleu.jsonl").exists()
