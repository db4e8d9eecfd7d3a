"""The CUDA path on a real GPU: bf16 and fp16 training, the fused optimizer, the SDPA kernels
actually used, torch.compile, checkpoint and resume, beam search against the CPU's, and the
decoder-only LM against the CPU's losses.

Marked `cuda` and skipped without a GPU, so CI (CPU only) stays green: `pytest -m cuda` on a GPU
machine runs them (`make test-cuda`). `DEEPINIT_CUDA_TEST_DEVICE=cpu pytest -m cuda
tests/test_cuda.py` runs the device-agnostic ones on the CPU, which checks this file's own code
on a machine without a GPU; the CUDA-only checks then skip.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from runner.run.build import build_run
from runner.run.evaluate import evaluate_run
from runner.run.train import train
from runner.train.loop import Trainer
from tests.conftest import TINY, compose

DEVICE = os.environ.get("DEEPINIT_CUDA_TEST_DEVICE", "cuda")
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# 20 updates of the CI model on the toy task, logged every 5: small enough to run in seconds
RUN = [*TINY, f"trainer.device={DEVICE}", "trainer.max_updates=20", "trainer.log_interval=5",
       "trainer.valid_interval=10", "trainer.save_interval=10", "model.dropout=0.0"]


def cuda_only() -> None:
    if DEVICE != "cuda":
        pytest.skip("a CUDA-only check")


def train_losses(tmp: Path, name: str, extra: list[str]) -> tuple[dict, list[dict]]:
    cfg = compose([*RUN, *extra])
    result = train(cfg, tmp / name)
    rows = [json.loads(line) for line in (tmp / name / "metrics.jsonl").read_text().splitlines()]
    return result, [r for r in rows if r["split"] == "train"]


def test_bf16_training_follows_fp32(tmp_path):
    fp32, rows32 = train_losses(tmp_path, "fp32", ["trainer.precision=fp32"])
    bf16, rows16 = train_losses(tmp_path, "bf16", ["trainer.precision=bf16"])
    assert fp32["status"] == bf16["status"] == "ok"
    assert bf16["precision"] == "bf16"
    assert [r["step"] for r in rows16] == [5, 10, 15, 20]
    for a, b in zip(rows32, rows16):
        # bf16 keeps 8 bits of mantissa: over 20 updates the loss may drift by a few hundredths
        # of a nat out of ~5; a wrong cast or a lost update shows as tenths
        assert abs(a["loss"] - b["loss"]) < 0.05, (a["step"], a["loss"], b["loss"])
    assert rows16[-1]["loss"] < rows16[0]["loss"] - 0.2  # it trains


def test_fp16_training_with_loss_scaling(tmp_path):
    cuda_only()
    fp32, rows32 = train_losses(tmp_path, "fp32", ["trainer.precision=fp32"])
    fp16, rows16 = train_losses(tmp_path, "fp16", ["trainer.precision=fp16"])
    assert fp16["status"] == "ok" and fp16["precision"] == "fp16"
    for a, b in zip(rows32, rows16):
        assert abs(a["loss"] - b["loss"]) < 0.02, (a["step"], a["loss"], b["loss"])  # 11-bit mantissa
        # the scale is logged on every train line and has not collapsed (the fairseq failure)
        assert b["loss_scale"] >= 1.0 and b["overflows"] <= 5, b
    assert rows16[-1]["loss"] < rows16[0]["loss"] - 0.2


def test_fp16_scale_collapse_is_reported_as_divergence(tmp_path):
    cuda_only()
    # a huge SGD step at update 1 makes every later fp16 forward overflow: each update is skipped
    # and the scale halves, from 65536 below 1e-4 in 30 updates
    result, rows = train_losses(tmp_path, "collapse", [
        "trainer.precision=fp16", "optim=sgd", "optim.lr=1e9", "warmup=none", "warmup.updates=0",
        "schedule=constant",
        "trainer.max_updates=100", "trainer.divergence.check_interval=1",
        "trainer.divergence.patience=1000"])
    assert result["status"] == "diverged", result
    assert "trainer.min_loss_scale" in result["reason"]
    assert 25 <= result["diverged_step"] <= 40
    assert rows[-1]["loss_scale"] < 1e-4 and rows[-1]["overflows"] >= 25


def test_fused_adam_matches_foreach(tmp_path):
    fused, rows_f = train_losses(tmp_path, "fused", ["trainer.precision=fp32", "optim.fused=true"])
    plain, rows_p = train_losses(tmp_path, "foreach", ["trainer.precision=fp32", "optim.fused=false"])
    parts = build_run(compose([*RUN, "trainer.precision=fp32"]))
    assert parts.optimizer.defaults["fused"] is True  # optim.fused=null: fused where it runs
    for a, b in zip(rows_f, rows_p):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4), a["step"]


def test_radam_on_the_device_follows_the_cpu(tmp_path):
    """RAdam (the Admin recipes' optimizer) updates its parameters as lists (torch._foreach_*);
    on the GPU those are multi-tensor kernels, on the CPU per-tensor ones: same losses within
    fp32 rounding over 20 updates, past step 6, where the rectified update starts."""
    radam = ["trainer.precision=fp32", "optim=radam", "warmup=none", "optim.lr=1e-3"]
    _, on_device = train_losses(tmp_path, "device", radam)
    cfg = compose([*[o for o in RUN if not o.startswith("trainer.device=")], "trainer.device=cpu", *radam])
    train(cfg, tmp_path / "cpu")
    rows = [json.loads(line) for line in (tmp_path / "cpu" / "metrics.jsonl").read_text().splitlines()]
    on_cpu = [r for r in rows if r["split"] == "train"]
    assert [r["step"] for r in on_device] == [r["step"] for r in on_cpu] == [5, 10, 15, 20]
    for a, b in zip(on_device, on_cpu):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4), a["step"]


def _one_step_ops(extra: list[str]) -> set[str]:
    """The profiler's op names of one bf16 training update."""
    parts = build_run(compose([*RUN, "trainer.precision=bf16", *extra]))
    trainer = Trainer(parts)
    trainer.step()  # warm-up (lazy inits)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        trainer.step()
        torch.cuda.synchronize()
    return {e.key for e in prof.key_averages()}


def test_sdpa_runs_flash_or_memory_efficient_kernels():
    cuda_only()
    ops = _one_step_ops([])
    fast = {op for op in ops if "_scaled_dot_product" in op and
            any(k in op for k in ("flash", "efficient", "cudnn"))}
    assert fast, sorted(op for op in ops if "scaled_dot" in op)
    assert not any("scaled_dot_product_attention_math" in op for op in ops)


def test_unpadded_batches_run_under_the_flash_kernel_alone():
    cuda_only()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    parts = build_run(compose([*RUN, "trainer.precision=bf16"]))
    model = parts.model
    # equal-length sentences: no padding mask anywhere, the decoder's self-attention is_causal;
    # sdpa raises "No available kernel" if any call needed a mask or the math fallback
    src = torch.randint(4, 100, (8, 12), device="cuda")
    prev = torch.randint(4, 100, (8, 10), device="cuda")
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]), torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(src, prev, False)
    logits.float().sum().backward()
    assert torch.isfinite(logits).all()


class no_host_sync:
    """Inside, any op that makes the host wait for the GPU (item(), float(), a blocking copy,
    nonzero) raises: PyTorch's sync debug mode."""

    def __enter__(self):
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode("default")


def test_bf16_updates_do_not_wait_for_the_gpu():
    cuda_only()
    trainer = Trainer(build_run(compose([*RUN, "trainer.precision=bf16"])))
    trainer.step()  # warm-up: lazy inits (cuBLAS handles, optimizer state, the pinned-memory pool)
    # the loop reads the loss and divergence counters only every log/check interval
    with no_host_sync():
        outs = [trainer.step() for _ in range(3)]
    assert trainer.state.step == 4
    assert all(bool(torch.isfinite(out.loss_sum)) for out in outs)


def test_validation_does_not_wait_for_the_gpu():
    cuda_only()
    trainer = Trainer(build_run(compose([*RUN, "trainer.precision=bf16"])))
    trainer.validation_sums()  # warm-up
    # the loss sums are read once, after the loop, by validation_loss()
    with no_host_sync():
        sums, tokens = trainer.validation_sums()
    assert tokens > 0 and bool(torch.isfinite(sums).all())
    assert trainer.validation_loss().loss == pytest.approx(float(sums[0]) / tokens, rel=1e-6)


@pytest.mark.parametrize("scope", ["model", "layers"])
def test_compile_matches_eager_and_stops_recompiling(tmp_path, scope):
    cuda_only()
    import torch._dynamo
    from torch._dynamo.utils import counters

    more = ["data.toy.train_size=4000"]  # enough batches that updates 21-40 bring new shapes
    eager, rows_e = train_losses(tmp_path, "eager", ["trainer.precision=fp32",
                                                     "trainer.max_updates=40", *more])
    torch._dynamo.reset()
    counters.clear()
    cfg = compose([*RUN, "trainer.precision=fp32", "trainer.max_updates=40", "trainer.compile=true",
                   f"trainer.compile_scope={scope}", *more])
    parts = build_run(cfg)
    trainer = Trainer(parts)

    def shapes(out):
        return {(tuple(b.src_tokens.shape), tuple(b.prev_tokens.shape)) for b in out.batches}

    def mask_flags(out):  # compiled training masks every source: no graph per padding flag
        return {b.src_has_pad for b in out.batches}

    seen, flags_seen = set(), set()
    for _ in range(20):  # warm-up: the batch shapes seen so far make dims dynamic
        out = trainer.step()
        seen |= shapes(out)
        flags_seen |= mask_flags(out)
    graphs_after_warmup = counters["stats"]["unique_graphs"]
    outs = [trainer.step() for _ in range(20)]
    recompiles = counters["stats"]["unique_graphs"] - graphs_after_warmup
    new_shapes = set().union(*(shapes(o) for o in outs)) - seen
    new_flags = set().union(*(mask_flags(o) for o in outs)) - flags_seen
    print(f"compiled graphs after 20 warm-up updates: {graphs_after_warmup}; new graphs in the next "
          f"20: {recompiles} ({len(new_shapes)} batch shapes not seen before, source-padding flags "
          f"not seen before: {sorted(new_flags)}); graph breaks: {dict(counters['graph_break'])}")
    assert graphs_after_warmup > 0  # it compiled (compile errors fall back to eager silently)
    assert new_shapes  # the check below could not see a recompile per shape otherwise
    # no graph per new shape, nor for a padding flag first seen now (src_mask_always)
    assert recompiles == 0
    # the same 40 updates eagerly (dropout off: compiled dropout draws other random numbers);
    # the window's loss is per target token over updates 36-40
    last = outs[-5:]
    compiled_last = sum(float(o.loss_sum) for o in last) / sum(o.tokens for o in last)
    assert compiled_last == pytest.approx(rows_e[-1]["loss"], rel=2e-3)


def test_checkpoint_on_gpu_resumes_and_loads_on_cpu(tmp_path):
    common = [*RUN, "trainer.save_interval=10", "model.dropout=0.1",
              f"trainer.precision={'bf16' if DEVICE == 'cuda' else 'fp32'}"]
    a = train(compose([*common, "trainer.max_updates=40"]), tmp_path / "whole")
    split = tmp_path / "split"
    train(compose([*common, "trainer.max_updates=20"]), split)
    (split / "result.json").unlink()  # as if killed after its update-20 checkpoint
    b = train(compose([*common, "trainer.max_updates=40"]), split)
    assert b["resumed"] is True and a["updates"] == b["updates"] == 40
    # CUDA's embedding backward adds with atomics (not bit-reproducible), hence a tolerance
    assert b["train_loss"] == pytest.approx(a["train_loss"], abs=2e-3)
    assert b["valid_loss"] == pytest.approx(a["valid_loss"], abs=2e-3)
    # the GPU's checkpoint decodes on the CPU (weights_only load, mapped to the CPU)
    record = evaluate_run(split, beam=2, average_last=0, device="cpu", update_result=False)
    assert record["sentences"] == 50 and record["device"] == "cpu"


def test_beam_search_on_gpu_gives_the_cpu_hypotheses(tmp_path):
    run = tmp_path / "run"
    cfg = compose([*TINY, "trainer.device=cpu", "trainer.max_updates=150", "trainer.threads=1",
                   "trainer.valid_interval=0", "trainer.save_interval=0"])
    assert train(cfg, run)["status"] == "ok"
    cpu = evaluate_run(run, beam=5, average_last=0, device="cpu", update_result=False)
    cpu_hyps = (run / "eval" / "test.hyp").read_text().splitlines()
    # fp32 matmuls on both sides (False is torch's default; made explicit). Not monkeypatch:
    # torch.backends.cuda.matmul is a module whose attributes monkeypatch cannot undo
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        gpu = evaluate_run(run, beam=5, average_last=0, device=DEVICE, update_result=False)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    gpu_hyps = (run / "eval" / "test.hyp").read_text().splitlines()
    assert gpu["device"].startswith(DEVICE)
    differing = [i for i, (a, b) in enumerate(zip(cpu_hyps, gpu_hyps)) if a != b]
    assert len(cpu_hyps) == len(gpu_hyps) == 50
    print(f"beam-5 hypotheses differing between CPU and {DEVICE}: {len(differing)} of 50")
    # the two devices' kernels round differently (about 1 ulp), which may flip a near tie
    # between two beams; more than one of 50 sentences differing is a bug, not rounding
    assert len(differing) <= 1, [(cpu_hyps[i], gpu_hyps[i]) for i in differing[:3]]
    assert gpu["bleu"] == pytest.approx(cpu["bleu"], abs=1.0)


@pytest.mark.parametrize("beam", [1, 5])
def test_beam_search_waits_for_the_gpu_once_a_step(beam, monkeypatch):
    """A decode step reads the device once (runner.decode.search._to_host); any other read
    would stop the host from queueing the next step's kernels while the GPU runs. The CPU
    counterpart (tests/decode/test_search.py) counts the torch ops and copies that would wait."""
    cuda_only()
    import warnings

    from runner.decode import search
    from runner.run.build import model_for

    torch.manual_seed(0)
    model = model_for(compose(["model=ci", "model.dropout=0.0"]), 40, 40, 1)
    model = model.to(DEVICE).select_kernels("cuda").eval()
    src = torch.randint(4, 40, (24, 9), device=DEVICE)
    src[:, -1] = 2
    src[::3, 4], src[::3, 5:] = 2, 1  # shorter sources, padded: their length caps come first
    steps = []
    real = search._to_host
    monkeypatch.setattr(search, "_to_host", lambda flags: steps.append(1) or real(flags))

    def waits(max_len_b: int) -> tuple[int, int]:
        steps.clear()
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                search.generate(model, src, beam, 1, 0, 2, max_len_a=1.0, max_len_b=max_len_b)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return len(steps), sum("synchroniz" in str(w.message) for w in caught)

    waits(2)  # warm-up: lazy CUDA inits
    short_steps, short_waits = waits(2)
    long_steps, long_waits = waits(12)
    print(f"beam {beam}: {short_steps} steps, {short_waits} waits; "
          f"{long_steps} steps, {long_waits} waits")
    assert long_steps - short_steps >= 8
    # every further step waits once; the waits outside the steps (is there padding, the length
    # caps there and back, the result lists) do not depend on how many steps ran
    assert long_waits - short_waits == long_steps - short_steps
    assert short_waits <= short_steps + 8


# task=lm on the device: a real-tier LM suite may train on a lent GPU (trainer.device=cuda)
LM_RUN = ["task=lm", "data=text", "data.bpe_merges=100", "model=ci", "model.max_positions=16",
          "data.block_size=16", "data.batch_size=8", "trainer.max_updates=20", "trainer.log_interval=5",
          "trainer.valid_interval=10", "trainer.save_interval=10", "warmup.updates=2", "optim.lr=1e-2",
          "trainer.threads=1", "trainer.progress=false", "trainer.tensorboard=false",
          "trainer.keep_checkpoints=0"]


def lm_losses(tmp: Path, name: str, extra: list[str]) -> tuple[dict, list[float]]:
    corpus = tmp / "corpus"
    if not corpus.exists():  # seeded random words: no corpus needs to be carried to the GPU machine
        import numpy as np

        rng = np.random.default_rng(0)
        words = ["the", "king", "speaks", "and", "queen", "answers", "thou", "art", "night"]
        corpus.mkdir()
        (corpus / "a.txt").write_text("".join(" ".join(rng.choice(words, size=8)) + "\n" for _ in range(300)))
    result = train(compose([*LM_RUN, f"data.dir={corpus}", *extra]), tmp / name)
    rows = [json.loads(line) for line in (tmp / name / "metrics.jsonl").read_text().splitlines()]
    return result, [r["loss"] for r in rows if r["split"] == "train"]


def test_lm_trains_on_the_device_as_on_the_cpu(tmp_path):
    """The decoder-only LM in fp32 on the device follows the CPU's losses (the same blocks, the
    same init); in bf16 it follows fp32 within bf16's rounding; both end with bits per token."""
    cpu, cpu_losses = lm_losses(tmp_path, "cpu", ["trainer.device=cpu", "trainer.precision=fp32"])
    dev, dev_losses = lm_losses(tmp_path, "fp32", [f"trainer.device={DEVICE}", "trainer.precision=fp32"])
    assert cpu["status"] == dev["status"] == "ok" and dev["updates"] == 20 and len(dev_losses) == 4
    # fp32 on both: kernels differ only in summation order; a wrong mask or a lost update would
    # show as tenths of a nat
    assert max(abs(a - b) for a, b in zip(cpu_losses, dev_losses)) < 0.01, (cpu_losses, dev_losses)
    assert dev_losses[-1] < dev_losses[0] - 0.2  # it trains
    assert dev["valid_bpt"] > 0 and dev["device"].startswith(DEVICE)
    if DEVICE == "cuda":
        bf16, bf16_losses = lm_losses(tmp_path, "bf16", ["trainer.device=cuda", "trainer.precision=bf16"])
        assert bf16["precision"] == "bf16"
        assert max(abs(a - b) for a, b in zip(dev_losses, bf16_losses)) < 0.05, (dev_losses, bf16_losses)
