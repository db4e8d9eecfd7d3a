"""deepinit bench: a few updates of every path end to end (JSON contents, not timings), the
model-FLOPs formula against torch's FLOP counter, the peer ratio bookkeeping, and the
plain-PyTorch reference (--reference): its model, its batches, its side-by-side report."""
from __future__ import annotations

import json
import math
import statistics

import numpy as np
import pytest
import torch

from runner.bench.compare import summarize_pair
from runner.bench.corpus import fairseq_generate_batches, iwslt_dir, write_corpus
from runner.cli.bench import main as main_bench
from runner.model.flops import train_flops
from runner.run.allocator import cpu_training_allocator, reason_left_alone


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    out = tmp / "bench.json"
    rc = main_bench(["--quick", "--threads", "1", "--decode-sentences", "4",
                     "--work", str(tmp / "work"), "--out", str(out)])
    return rc, json.loads(out.read_text())


def test_quick_bench_writes_every_measure(quick):
    rc, report = quick
    assert rc == 0
    assert [e["name"] for e in report["entries"]] == ["ci", "depth-2-ckpt"]
    assert report["peak"]["gflops"] > 0 and report["peak"]["dtype"] == "fp32"
    ci = report["entries"][0]
    assert ci["status"] == "ok" and ci["device"] == "cpu" and ci["precision"] == "fp32"
    assert ci["src_vocab"] == ci["tgt_vocab"] == 1000  # the peer's 1k-vocabulary stream
    assert len(ci["windows"]) == 2
    for w in ci["windows"]:
        assert w["updates"] == 2 and w["tokens"] > 0 and w["seconds"] > 0
        assert w["tokens_per_s"] == pytest.approx(w["tokens"] / w["seconds"])
    assert ci["tokens_per_s_min"] <= ci["tokens_per_s"] <= ci["tokens_per_s_max"]
    # token-bucketed batches of at most 2048 padded tokens per side
    assert 0 < ci["tokens_per_update"] <= 2048 and 0 <= ci["padding_fraction"] < 0.5
    assert ci["peak_memory_mb"] >= ci["rss_before_trainer_mb"] > 0
    assert ci["flops_per_target_token"] > 6 * 32 * 1000  # at least the output projection
    for key in ("beam5", "greedy"):
        assert ci[key]["sentences"] == 4 and ci[key]["sentences_per_s"] > 0
    depth = report["entries"][1]
    assert depth["status"] == "ok" and depth["checkpointing"] is True and depth["layers"] == 2
    assert math.isfinite(depth["train_loss"])
    assert "init=tfixup" in depth["overrides"] and "norm=none" in depth["overrides"]


def test_corpus_keeps_the_most_frequent_types(tmp_path):
    folder = write_corpus(tmp_path, 50)
    train = (folder / "train.en").read_text().split("\n")[:-1]
    types = {tok for line in train for tok in line.split()}
    assert len(types - {"<unk>"}) == 46 and "<unk>" in types  # 50 minus the 4 specials
    assert len(train) == 13533  # IWSLT'14 valid + test lines 501.. (or the synthetic stand-in)
    assert (folder / "valid.de").read_text() == (folder / "test.de").read_text()


def test_fairseq_generate_batches_on_the_peer_test_set():
    """The batches fairseq 0.12.3 fairseq-generate decodes for the peer's 500 test sentences
    (--max-tokens 4096 --batch-size 128), recorded from an instrumented run: sizes, padded
    source widths, and the 4 longest sentences (lines 2, 8, 83, 107) never decoded."""
    import gzip

    if not (iwslt_dir() / "test.de.gz").is_file():
        pytest.skip("IWSLT'14 text not present")
    lengths = {}
    for lang in ("de", "en"):
        with gzip.open(iwslt_dir() / f"test.{lang}.gz", "rt", encoding="utf-8") as f:
            lines = f.read().split("\n")[:500]
        lengths[lang] = np.array([len(line.split()) + 1 for line in lines])  # + eos
    batches = fairseq_generate_batches(lengths["de"], lengths["en"], 4096, 128)
    assert [len(b) for b in batches] == [128, 128, 104, 64, 48, 24]
    assert [int(lengths["de"][b].max()) for b in batches] == [16, 25, 35, 48, 72, 116]
    decoded = np.concatenate(batches)
    assert sorted(set(range(500)) - set(decoded.tolist())) == [1, 7, 82, 106]
    # every batch keeps rows x max(source, target) within max tokens
    longest = np.maximum(lengths["de"], lengths["en"])
    assert all(len(b) * longest[b].max() <= 4096 for b in batches)


def test_fairseq_generate_batches_rules():
    src = np.array([5] * 20)
    # 8-multiples are committed; the last 4 sentences form a batch of 4, which fairseq drops
    assert [len(b) for b in fairseq_generate_batches(src, src, 4096, 16)] == [16]
    assert [len(b) for b in fairseq_generate_batches(src, src, 4096, 16, multiple=1)] == [16, 4]
    # max(source, target) counts: 10 rows x 10 tokens fit 100, so batches of 8 (the multiple)
    assert [len(b) for b in fairseq_generate_batches(src, src * 2, 100, 128)] == [8, 8]
    # order: source length first, ties by target length
    order = np.concatenate(fairseq_generate_batches(np.array([3, 1, 3, 1]), np.array([2, 9, 1, 1]),
                                                    4096, 128, multiple=1))
    assert order.tolist() == [3, 1, 2, 0]


def test_train_flops_matches_torch_flop_counter():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from runner.run.build import model_for as build_model
    from tests.conftest import compose

    cfg = compose(["model=ci", "model.dim=32", "model.ffn_dim=48", "model.dropout=0",
                   "model.share_embeddings=decoder_io", "data.joined_dictionary=false"])
    vocab, b, s, t = 40, 3, 7, 5
    model = build_model(cfg, vocab, vocab, 1)
    torch.manual_seed(0)
    src = torch.randint(4, vocab, (b, s))
    prev = torch.randint(4, vocab, (b, t))
    # the math backend runs attention as bmm, which the counter sees (the CPU flash kernel is
    # not counted); every matmul of forward and backward, exactly
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(src, prev, False).sum().backward()
    expected = train_flops(32, 48, 2, 2, vocab, np.full(b, s), np.full(b, t))
    assert counter.get_total_flops() == expected


def test_peer_ratios_are_medians_of_alternating_runs():
    ours = [{"tokens_per_s": v, "flops_per_target_token": 1e6, "status": "ok",
             "beam5": {"sentences_per_s": 10.0} if i == 0 else None}
            for i, v in enumerate([130.0, 150.0, 140.0])]
    peer = [{"tokens_per_s": v, "returncode": 0, "beam5_sentences_per_s": 5.0 if i == 0 else None}
            for i, v in enumerate([100.0, 90.0, 110.0])]
    row = summarize_pair("small", "iwslt", ours, peer, {"gflops": 1.0})
    assert row["tokens_per_s"]["ratio"] == pytest.approx(1.4)
    assert row["beam5_sentences_per_s"]["ratio"] == pytest.approx(2.0)
    assert row["greedy_sentences_per_s"]["ratio"] is None
    assert row["mfu"]["deepinit"] == pytest.approx(140.0 * 1e6 / 1e9)


def test_peer_mode_without_tooling_is_a_one_line_error(tmp_path, capsys):
    assert main_bench(["--peer", "--peer-tools", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("deepinit: error: no peer tooling")


def test_cpu_dropout_rate_scale_gradient_and_seed():
    from runner.model.dropout import Dropout, keep_mask

    keep, scale = keep_mask(torch.Size([400, 500]), 0.3)
    assert abs(1 - keep.float().mean().item() - 0.3) < 0.005  # 200k draws: 0.3 +- 5 sigma
    assert scale == pytest.approx(1 / 0.7, rel=2e-5)
    # the three 16-bit fields of each draw are independent: no pattern across neighbours
    pairs = keep.view(-1)[:-1] & keep.view(-1)[1:]
    assert abs(pairs.float().mean().item() - 0.49) < 0.01
    drop = Dropout(0.3)
    x = torch.randn(64, 33, requires_grad=True)
    torch.manual_seed(3)
    y = drop(x)
    y.backward(torch.ones_like(y))
    kept = y != 0
    torch.testing.assert_close(y[kept], x[kept] * scale)
    torch.testing.assert_close(x.grad, kept.float() * scale)
    torch.manual_seed(3)
    assert torch.equal(drop(x), y)  # masks come from torch's seeded generator
    drop.eval()
    assert drop(x) is x



def test_cpu_dropout_under_torch_compile_is_one_graph():
    """The CPU mask's in-place draw on a reinterpreted view breaks dynamo's graph; each break in
    a sublayer's dropout made dynamo recompile Sublayer.forward until its recompile limit, and
    the compiled model fell back to eager. Under compile the dropout is torch's (fused by
    Inductor)."""
    import torch._dynamo

    from runner.model.dropout import Dropout

    drop = Dropout(0.3)
    explained = torch._dynamo.explain(lambda x: drop(x) * 2)(torch.randn(8, 16))
    assert explained.graph_break_count == 0 and explained.graph_count == 1


# ----------------------------------------------------------------------------- --reference
@pytest.fixture(scope="module")
def with_reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench-reference")
    out = tmp / "bench.json"
    rc = main_bench(["--quick", "--presets", "ci", "--depths", "--reference", "--reps", "2", "--no-decode",
                     "--threads", "1", "--work", str(tmp / "work"), "--out", str(out)])
    return rc, json.loads(out.read_text()), out.with_suffix(".md").read_text()


def test_reference_side_by_side_report(with_reference):
    rc, report, markdown = with_reference
    assert rc == 0
    assert [e["name"] for e in report["entries"]] == ["ci"]  # no depth entries, one preset entry
    row = report["reference"]["ci"]
    ours, refs = row["deepinit_runs"], row["reference_runs"]
    assert len(ours) == len(refs) == 2
    assert all(r["status"] == "ok" and "kind" not in r for r in ours)
    assert all(r["status"] == "ok" and r["kind"] == "reference" for r in refs)
    # deepinit's CPU training keeps freed host memory; the plain-PyTorch reference has glibc's own
    assert all(r["host_allocator"] == cpu_training_allocator() for r in ours)
    assert all(r["host_allocator"] == (reason_left_alone() or "glibc, default thresholds") for r in refs)
    assert report["entries"][0]["windows"] == ours[0]["windows"]  # the preset table shows run 1
    assert all(r["tokens_per_s"] > 0 for r in ours + refs)
    tps = row["tokens_per_s"]
    mine = statistics.median(r["tokens_per_s"] for r in ours)
    theirs = statistics.median(r["tokens_per_s"] for r in refs)
    assert tps["deepinit"] == pytest.approx(mine) and tps["reference"] == pytest.approx(theirs)
    assert tps["ratio"] == pytest.approx(mine / theirs)
    assert tps["target"] == 1.2
    # same shapes on the same batches: the same model FLOPs per target token on both sides
    flops = {r["flops_per_target_token"] for r in ours + refs}
    assert len(flops) == 1
    peak = report["peak"]["gflops"]
    assert row["mfu"]["reference"] == pytest.approx(theirs * flops.pop() / 1e9 / peak)
    ref = refs[0]
    assert ref["device"] == "cpu" and ref["precision"] == "fp32" and math.isfinite(ref["train_loss"])
    assert ref["peak_memory_mb"] > 0 and ref["memory_kind"] == "max_rss"
    assert "| ci | 32-64-2, 2+2 fp32 |" in markdown.split("plain PyTorch")[1]


def test_reference_trains_on_the_entrys_batches(with_reference):
    """Run by run, the reference's timed windows hold exactly the target tokens of deepinit's."""
    _, report, _ = with_reference
    row = report["reference"]["ci"]
    tokens = [[w["tokens"] for w in r["windows"]] for r in row["deepinit_runs"] + row["reference_runs"]]
    assert len(tokens[0]) == 2 and all(t == tokens[0] for t in tokens)
    for key in ("tokens_per_update", "padding_fraction"):
        assert len({r[key] for r in row["deepinit_runs"] + row["reference_runs"]}) == 1


def test_update_freq_counts_whole_updates(tmp_path):
    """With trainer.update_freq=2 an update is two micro-batches: deepinit's windows count both,
    as the reference's do (the same batches)."""
    out = tmp_path / "bench.json"
    rc = main_bench(["--quick", "--presets", "ci", "--depths", "--reference", "--reps", "1", "--no-decode",
                     "--threads", "1", "--work", str(tmp_path / "work"), "--out", str(out),
                     "trainer.update_freq=2"])
    assert rc == 0
    row = json.loads(out.read_text())["reference"]["ci"]
    ours, ref = row["deepinit_runs"][0], row["reference_runs"][0]
    assert [w["tokens"] for w in ours["windows"]] == [w["tokens"] for w in ref["windows"]]
    assert ours["tokens_per_update"] == ref["tokens_per_update"]
    # the reference groups micro-batches into updates as the Trainer does (tested below), so equal
    # windows mean deepinit's count whole updates (counting per micro-batch covered half of them)


def test_reference_batches_are_the_trainers_in_order():
    """update_batches yields Trainer._next_batches' micro-batches, update by update, across an
    epoch boundary and with gradient accumulation."""
    from runner.bench.reference import update_batches
    from runner.run.build import build_run
    from runner.train.loop import Trainer
    from tests.conftest import TINY, compose

    parts = build_run(compose([*TINY, "data.toy.train_size=120", "data.max_tokens=256",
                               "trainer.update_freq=2"]))
    trainer = Trainer(parts)
    mine = update_batches(parts)
    updates = len(parts.batches) + 2  # two micro-batches each: past the first epoch
    seen = []
    for _ in range(updates):
        batches, ntokens = trainer._next_batches()
        indices, ours, our_tokens = next(mine)
        assert our_tokens == ntokens and len(ours) == len(batches) == 2
        for a, b in zip(ours, batches):
            for field in ("src_tokens", "prev_tokens", "target"):
                assert torch.equal(getattr(a, field), getattr(b, field))
        seen += [tuple(i) for i in indices]
    assert trainer.state.pos.epoch >= 2 and len(set(seen)) < len(seen)  # the stream did roll over


def _reference_model(extra=()):
    from runner.bench.reference import ReferenceSeq2Seq
    from tests.conftest import compose

    cfg = compose(["model=ci", "model.dropout=0", "model.share_embeddings=decoder_io",
                   "data.joined_dictionary=false", *extra])
    torch.manual_seed(0)
    return ReferenceSeq2Seq(cfg, 40, 30, 1)


def test_reference_model_learns_and_is_causal():
    from runner.bench.reference import reference_loss

    model = _reference_model()
    assert model.output_weight is model.tgt_embed.weight  # decoder input/output tied
    assert model.src_embed.weight is not model.tgt_embed.weight
    assert model.transformer.encoder.norm is None  # Post-LN: no final norm
    assert _reference_model(["norm=pre"]).transformer.encoder.norm is not None
    torch.manual_seed(1)
    src = torch.randint(4, 40, (4, 7))
    src[0, 5:] = 1  # right padding
    target = torch.randint(4, 30, (4, 6))
    target[1, 4:] = 1
    prev = torch.cat([torch.full((4, 1), 2), target[:, :-1]], dim=1)
    prev[1, 5:] = 1
    # training mode, as the bench runs it (dropout is 0; eval mode would take torch's
    # nested-tensor inference path instead)
    with torch.no_grad():
        logits = model(src, prev)
        later = prev.clone()
        later[:, 3] = (later[:, 3] + 5) % 26 + 4  # change position 3 in every row
        changed = model(src, later)
        alone = model(src[:1, :5], prev[:1])  # row 0 without its source padding
    assert torch.allclose(changed[:, :3], logits[:, :3], atol=1e-6)
    assert not torch.allclose(changed[:, 3:], logits[:, 3:], atol=1e-3)
    # the source padding is masked in the encoder and in the cross-attention
    assert torch.allclose(alone[0], logits[0], atol=1e-5)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        loss = reference_loss(model(src, prev), target, 1, 0.1) / int((target != 1).sum())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


def test_compile_both_plans_an_eager_and_a_compiled_entry():
    from runner.bench.entries import plan_entries, resolve_args
    from runner.cli.bench import parse_args

    args = parse_args(["--presets", "ci", "small", "--compile", "both", "--depths"])
    assert resolve_args(args, cuda=False) is None
    plan = plan_entries(args)
    assert [(e.name, e.compile) for e in plan] == [("ci-eager", False), ("ci-compiled", True),
                                                   ("small-eager", False), ("small-compiled", True)]
    assert plan[0].overrides == plan[1].overrides and plan[0].max_tokens == plan[1].max_tokens
    for setting, compiled in (("auto", False), ("on", True), ("off", False)):
        args = parse_args(["--presets", "ci", "--compile", setting, "--depths"])
        assert resolve_args(args, cuda=False) is None
        assert [(e.name, e.compile) for e in plan_entries(args)] == [("ci", compiled)]
    args = parse_args(["--peer", "--compile", "both"])
    assert "--peer" in resolve_args(args, cuda=False)


def test_an_override_for_the_presets_leaves_the_depth_entries_at_their_depth():
    """`deepinit bench --depths 6 200 model.layers=12 norm=pre`: the presets run 12+12 Pre-LN, the
    depth entries stay the 6+6 and 200+200 T-Fixup models without norms that their table names."""
    from runner.bench.entries import plan_entries, resolve_args
    from runner.cli.bench import parse_args
    from tests.conftest import compose

    args = parse_args(["--presets", "ci", "--depths", "6", "200", "model.layers=12", "norm=pre", "model.dim=32"])
    assert resolve_args(args, cuda=False) is None
    preset, *depth = [e for e in plan_entries(args) if e.name in ("ci", "depth-6", "depth-200")]
    assert compose(preset.overrides).model.num_encoder_layers == 12
    for entry, layers in zip(depth, (6, 200)):
        cfg = compose(entry.overrides)
        assert (cfg.model.num_encoder_layers, cfg.model.num_decoder_layers) == (layers, layers)
        assert cfg.norm.placement == "none" and cfg.model.dim == 32  # other overrides still apply
    assert "--depths expects layer counts" in resolve_args(parse_args(["--depths", "6", "deep"]), cuda=False)

def test_gpu_presets_compose_to_their_shapes():
    from runner.bench.entries import PRESETS, RECIPE, SCHEDULE
    from tests.conftest import compose

    for name, (dim, ffn, heads, layers) in {"big": (1024, 4096, 16, 6), "base-18": (512, 2048, 8, 18)}.items():
        model, vocab, max_tokens = PRESETS[name]
        m = compose(RECIPE + model).model
        assert (m.dim, m.ffn_dim, m.heads, m.num_encoder_layers, m.num_decoder_layers) == (
            dim, ffn, heads, layers, layers)
        assert vocab is None and max_tokens == PRESETS["base"][2] and SCHEDULE[name] == SCHEDULE["base"]


def test_tables_print_when_the_first_entry_failed(capsys):
    from runner.bench.tables import print_tables

    report = {"peak": {"gflops": 100.0, "dtype": "fp32", "source": "measured"},
              "machine": {"device_name": "cpu", "threads": 1},
              "entries": [{"name": "small", "group": "preset", "status": "failed", "error": "boom"}]}
    print_tables(report)
    assert "failed" in capsys.readouterr().out


def test_profile_records_the_updates_after_the_timed_windows(tmp_path, capsys):
    """--profile N: N updates after the timed ones are profiled (N step spans in the trace),
    the timed windows are the same as without it, the operator table and the trace are written
    next to the JSON, and the top operators' shares of the total self time add up to at most 1."""
    out = tmp_path / "b.json"
    rc = main_bench(["--quick", "--threads", "1", "--no-decode", "--depths", "--profile", "2",
                     "--work", str(tmp_path / "work"), "--out", str(out)])
    assert rc == 0
    (ci,) = json.loads(out.read_text())["entries"]
    assert len(ci["windows"]) == 2 and all(w["updates"] == 2 for w in ci["windows"])
    # 2 warm-up + 4 timed + 1 (closes the CPU time, warms the profiler up) + 2 profiled
    assert "trainer.max_updates=9" in ci["overrides"]
    prof = ci["profile"]
    assert prof["updates"] == 2 and prof["sort_by"] == "self_cpu_time_total"
    assert prof["table"] == str(tmp_path / "b.ci.profile.txt")
    table = (tmp_path / "b.ci.profile.txt").read_text()
    assert "aten::mm" in table and "Self CPU" in table
    trace = json.loads((tmp_path / "b.ci.trace.json").read_text())
    steps = {e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")}
    assert len(steps) == 2
    shares = [op["share"] for op in prof["top"]]
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1 + 1e-9
    assert any(op["name"] == "aten::mm" for op in prof["top"])
    assert "where an update's time goes" in capsys.readouterr().out
    assert "| ci | aten::" in out.with_suffix(".md").read_text()


def test_cuda_profile_summary_counts_gpu_time_once():
    """On CUDA, torch.profiler lists each kernel beside the operator that launched it (both
    carrying its GPU time) and gives the step annotation the device time of its whole span. The
    summary's total is the kernels' time alone and the ranking is of operators, so shares add up
    to at most 1. Events shaped like those of the H200 profile of the base preset (ms over 5
    updates)."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from runner.bench.profile import top_operators

    def event(key, device_type, device_ms, cpu_total_ms=0.0, count=5, annotation=False):
        return SimpleNamespace(key=key, device_type=device_type, count=count, self_device_time_total=device_ms * 1e3,
                               self_cpu_time_total=0.0, cpu_time_total=cpu_total_ms * 1e3,
                               is_user_annotation=annotation)

    cpu, gpu = DeviceType.CPU, DeviceType.CUDA
    # an annotation (the step, Optimizer.step) has a CPU row and a GPU row, the latter with the
    # device time of its span (the H200 table: ProfilerStep* 378.661 ms, Optimizer.step 3.126 ms)
    averages = [event("ProfilerStep*", cpu, 0.0, cpu_total_ms=380.0, annotation=True),
                event("ProfilerStep*", gpu, 378.661, annotation=True),
                event("Optimizer.step#AdamW.step", cpu, 0.0, cpu_total_ms=4.0, annotation=True),
                event("Optimizer.step#AdamW.step", gpu, 3.126, annotation=True),
                event("aten::mm", cpu, 25.833, count=735), event("nvjet_sm90_tst_256x128", gpu, 25.833, count=735),
                event("aten::_cudnn_attention_backward", cpu, 19.379, count=90),
                event("cudnn_generated_flash_bprop", gpu, 19.379, count=90),
                event("aten::copy_", cpu, 16.690, count=2090), event("elementwise_kernel", gpu, 16.690, count=2090)]
    summary = top_operators(averages, "self_device_time_total", 5)
    assert summary["self_ms_per_update"] == pytest.approx((25.833 + 19.379 + 16.690) / 5)
    assert summary["device_busy_ms_per_update"] == summary["self_ms_per_update"]
    assert summary["step_ms_per_update"] == pytest.approx(76.0)
    names = [op["name"] for op in summary["top"]]
    assert names == ["aten::mm", "aten::_cudnn_attention_backward", "aten::copy_"]
    assert summary["top"][0]["share"] == pytest.approx(25.833 / (25.833 + 19.379 + 16.690))
    assert sum(op["share"] for op in summary["top"]) == pytest.approx(1.0)


def test_profile_rejects_comparisons_and_negative_counts(capsys):
    assert main_bench(["--quick", "--profile", "2", "--reference"]) == 2
    assert main_bench(["--quick", "--profile", "-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--profile" in err[0] and "--profile" in err[1]


@pytest.mark.parametrize("started_with_sigint_ignored", [False, True])
def test_sigint_during_a_bench_exits_130_with_one_line(tmp_path, started_with_sigint_ignored):
    """Ctrl-C (or a time limit's SIGINT, as ci/gpu-session.sh sends) ends `deepinit bench` with
    status 130 and one line, not a traceback; also when a shell started it with SIGINT ignored
    (a script's `nohup deepinit ... &`)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import REPO

    def ignore_sigint():  # in the child before exec: SIG_IGN survives exec, as a shell's does
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    cmd = [sys.executable, "-m", "runner.cli", "bench", "--presets", "ci", "--device", "cpu", "--threads", "1",
           "--no-decode", "--depths", "--warmup", "1", "--steps", "100000", "--windows", "1",
           "--peak-gflops", "50", "--out", str(tmp_path / "b.json"), "--work", str(tmp_path / "work")]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True,
                            preexec_fn=ignore_sigint if started_with_sigint_ignored else None)
    try:
        seen = ""
        deadline = time.time() + 300
        while "timed updates" not in seen and time.time() < deadline and proc.poll() is None:
            seen += proc.stdout.readline()
        assert "timed updates" in seen, seen  # the entry is training: SIGINT lands inside the bench
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    out = tmp_path / "b.json"
    assert err.strip().splitlines()[-1] == f"deepinit bench: interrupted; the 0 finished entries are in {out}"
    report = json.loads(out.read_text())
    assert report["interrupted"] is True and report["entries"] == []


def test_a_given_peak_replaces_the_measured_one(tmp_path, monkeypatch, capsys):
    """--peak-gflops G: no matmul measurement; the report's peak, which every MFU divides by, is G."""
    from runner.bench import run as bench_run
    from runner.bench import workers

    def no_measuring(*args, **kwargs):
        raise AssertionError("the CPU peak was measured although --peak-gflops was given")

    def one_entry(entry, work, compose, kind="deepinit"):
        return {"name": entry.name, "group": entry.group, "status": "failed", "error": "stand-in"}

    monkeypatch.setattr(bench_run, "cpu_matmul_peak", no_measuring)
    monkeypatch.setattr(workers, "run_isolated", one_entry)
    out = tmp_path / "b.json"
    assert main_bench(["--presets", "tiny", "--device", "cpu", "--threads", "1", "--depths", "--no-decode",
                       "--peak-gflops", "123.5", "--out", str(out), "--work", str(tmp_path / "work")]) == 1  # failed entry
    peak = json.loads(out.read_text())["peak"]
    assert (peak["gflops"], peak["dtype"], peak["source"]) == (123.5, "fp32", "given (--peak-gflops)")
    assert "peak 124 GFLOP/s fp32 (given (--peak-gflops))" in out.with_suffix(".md").read_text()
    for bad in ("0", "-5", "nan", "inf"):
        capsys.readouterr()
        assert main_bench(["--presets", "tiny", "--device", "cpu", "--peak-gflops", bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"deepinit: error: --peak-gflops expects GFLOP/s > 0, got {float(bad)}"]


def test_a_stop_as_an_entry_starts_ends_the_entrys_process(tmp_path, monkeypatch):
    """A Ctrl-C (or a time limit's SIGINT) that lands just as an entry's process has started
    must end that process too: it had left the entry training on its own, or made the bench wait
    for the whole entry before it stopped."""
    import signal
    import subprocess
    import sys

    from runner.bench import workers
    from runner.bench.entries import plan_entries, resolve_args
    from runner.cli.bench import parse_args
    from tests.conftest import compose

    args = parse_args(["--presets", "tiny", "--device", "cpu", "--threads", "1", "--depths", "--no-decode"])
    assert resolve_args(args, cuda=False) is None
    entry = plan_entries(args)[0]
    started = []
    real_popen = subprocess.Popen

    def start_then_stop(cmd, **kwargs):
        child = real_popen([sys.executable, "-c", "import time; time.sleep(600)"], **kwargs)
        started.append(child)
        signal.raise_signal(signal.SIGINT)  # the stop arrives as the entry's process has started
        return child

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in the CLI
    monkeypatch.setattr(workers.subprocess, "Popen", start_then_stop)
    try:
        with pytest.raises(KeyboardInterrupt):
            workers.run_isolated(entry, tmp_path / "work", compose)
    finally:
        signal.signal(signal.SIGINT, previous)
        for child in started:
            if child.poll() is None:
                child.kill()
    assert len(started) == 1 and started[0].returncode == -signal.SIGKILL  # killed, not left running


def test_an_interrupted_bench_keeps_the_entries_that_finished(tmp_path, monkeypatch, capsys):
    """A time limit that cuts a GPU call short must not lose the entries measured before it: the
    report is written after each entry and once more at the interrupt."""
    from runner.bench import workers

    calls = []

    def one_entry_then_interrupt(entry, work, compose, kind="deepinit"):
        calls.append(entry.name)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return {"name": entry.name, "group": entry.group, "status": "failed", "error": "stand-in"}

    monkeypatch.setattr(workers, "run_isolated", one_entry_then_interrupt)
    out = tmp_path / "b.json"
    code = main_bench(["--presets", "tiny", "ci", "--device", "cpu", "--threads", "1", "--depths",
                       "--peak-gflops", "50", "--out", str(out), "--work", str(tmp_path / "work")])
    assert code == 130 and calls == ["tiny", "ci"]
    report = json.loads(out.read_text())
    assert report["interrupted"] is True
    assert [e["name"] for e in report["entries"]] == ["tiny"]
    assert out.with_suffix(".md").exists()
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"deepinit bench: interrupted; the 1 finished entries are in {out}")


def test_gpu_peak_is_the_datasheet_row_of_the_whole_model_name():
    from runner.run.hardware import cuda_bf16_peak
    expected = {"NVIDIA H100 80GB HBM3": ("H100", 989.4), "NVIDIA H100 PCIe": ("H100 PCIe", 756.0),
                "NVIDIA H100 NVL": ("H100 NVL", 835.0), "NVIDIA H200": ("H200", 989.4),
                "NVIDIA H200 NVL": ("H200 NVL", 835.0), "NVIDIA GH200 480GB": ("GH200", 989.4),
                "NVIDIA L40": ("L40", 181.0), "NVIDIA L40S": ("L40S", 362.0), "NVIDIA L4": ("L4", 121.0),
                "NVIDIA A10": ("A10", 125.0), "NVIDIA A100-SXM4-80GB": ("A100", 312.0)}
    for name, (key, tflops) in expected.items():
        peak = cuda_bf16_peak(name)
        assert (peak["source"], peak["gflops"]) == (f"datasheet ({key})", tflops * 1e3), name


def test_dynamo_counts_tell_a_compiled_entry_from_an_eager_fallback():
    """A compiled bench entry records how many graphs dynamo made: 0 means the compile failed
    and the entry timed the eager model (trainer.compile runs eagerly on a compile error)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from runner.bench.workers import dynamo_counts

    def with_a_break(x):
        y = x * 2
        torch._dynamo.graph_break()  # two graphs
        return y + 1

    torch._dynamo.reset()
    counters.clear()
    assert dynamo_counts() == {"graphs": 0, "graph_breaks": 0, "frames_failed": 0}
    fn = torch.compile(with_a_break, backend="eager")
    assert torch.equal(fn(torch.ones(3)), torch.full((3,), 3.0))
    assert dynamo_counts() == {"graphs": 2, "graph_breaks": 1, "frames_failed": 0}


def test_dynamo_counts_flag_frames_that_fell_back_to_eager():
    """A compile that made graphs can still run part of the model eagerly: a frame past the
    recompile limit is given up on. dynamo_counts counts such frames, and eager_fallback says so."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from runner.bench.workers import dynamo_counts, eager_fallback

    def scale(x, n):
        return x * n

    torch._dynamo.reset()
    counters.clear()
    # config.patch, not monkeypatch: monkeypatch's undo deletes the key from torch's config
    # module, and every later compile in the process then fails (and runs eagerly)
    with torch._dynamo.config.patch(recompile_limit=1):
        fn = torch.compile(scale, backend="eager", dynamic=False)
        for n in range(3):  # a new int specializes the graph: the second call needs a recompile
            assert torch.equal(fn(torch.ones(2), n), torch.full((2,), float(n)))
    assert dynamo_counts() == {"graphs": 1, "graph_breaks": 0, "frames_failed": 1}
    assert eager_fallback(dynamo_counts()) == "torch.compile gave up on 1 frame(s), which ran eagerly"
    assert eager_fallback({"graphs": 0, "graph_breaks": 0}).endswith("these are eager figures")
    assert eager_fallback({"graphs": 2, "graph_breaks": 1, "frames_failed": 0}) is None
    torch._dynamo.reset()


def test_an_interrupted_reference_comparison_keeps_its_finished_runs(tmp_path, monkeypatch):
    """--reference alternates deepinit and plain-PyTorch runs of one entry: a time limit in its
    fourth run keeps the three before it, the preset entry included."""
    from runner.bench import workers

    calls = []

    def three_runs_then_interrupt(entry, work, compose, kind="deepinit"):
        calls.append(kind)
        if len(calls) > 3:
            raise KeyboardInterrupt
        return {"name": entry.name, "group": entry.group, "kind": kind, "status": "failed",
                "error": "stand-in", "tokens_per_s": 100.0 * len(calls)}

    monkeypatch.setattr(workers, "run_isolated", three_runs_then_interrupt)
    out = tmp_path / "b.json"
    code = main_bench(["--presets", "tiny", "--reference", "--reps", "3", "--device", "cpu",
                       "--threads", "1", "--depths", "--peak-gflops", "50", "--out", str(out), "--work", str(tmp_path / "work")])
    assert code == 130 and calls == ["deepinit", "reference", "deepinit", "reference"]
    report = json.loads(out.read_text())
    assert [e["name"] for e in report["entries"]] == ["tiny"]
    row = report["reference"]["tiny"]
    assert row["tokens_per_s"]["deepinit_runs"] == [100.0, 300.0]
    assert row["tokens_per_s"]["reference_runs"] == [200.0]



def test_cuda_entries_warm_up_and_time_longer_than_the_cpu_schedules():
    """On CUDA a preset entry warms up at least CUDA_MIN_WARMUP updates and times windows of at
    least CUDA_MIN_STEPS (the CPU's 5-update windows of `small` timed start-up on an H200);
    the CPU keeps its schedule, and --quick and explicit counts still win."""
    from runner.bench.entries import CUDA_MIN_STEPS, CUDA_MIN_WARMUP, SCHEDULE, plan_entries, resolve_args
    from runner.cli.bench import parse_args

    def schedule(*argv: str) -> tuple[int, int, int]:
        args = parse_args(["--depths", *argv])
        assert resolve_args(args, cuda=False) is None
        (entry,) = plan_entries(args)
        return entry.warmup, entry.steps, entry.windows

    assert schedule("--presets", "small", "--device", "cpu") == SCHEDULE["small"] == (3, 5, 3)
    assert schedule("--presets", "small", "--device", "cuda") == (CUDA_MIN_WARMUP, CUDA_MIN_STEPS, 3) == (100, 20, 3)
    assert schedule("--presets", "base", "--device", "cuda") == (100, 20, 3)  # base's own 30 raised
    assert schedule("--presets", "small", "--device", "cuda", "--quick") == (2, 2, 2)
    assert schedule("--presets", "small", "--device", "cuda", "--warmup", "7", "--steps", "9") == (7, 9, 3)


def test_the_translation_reference_refuses_a_learned_embedding_scale():
    """The plain reference scales the token embeddings by a fixed sqrt(d) or 1: a config with
    model.embed_scale_learned would be compared with another model, so it is named instead."""
    from runner.bench.reference import unsupported
    from tests.conftest import compose

    assert unsupported(compose(["model=ci"])) == []
    assert unsupported(compose(["model=ci", "model.embed_scale=false", "model.embed_scale_learned=true"])) == [
        "model.embed_scale_learned"]
