"""Greedy and beam search over a whole split.

Beam search follows fairseq's SequenceGenerator (fairseq/sequence_generator.py; default beam 5,
lenpen 1 as Admin's eval, Transformer-Clinic nmt-experiments/eval_iwslt_de-en.sh):
- scores are summed log-probabilities; a finished hypothesis is ranked by score / len**lenpen,
  len counting the final eos;
- each step takes the 2*beam best (beam, token) candidates of a sentence; an eos among the top
  `beam` finalises that hypothesis, the first `beam` non-eos candidates continue;
- a sentence is done once `beam` hypotheses are finalised (fairseq's early stop), or when it
  reaches its maximum length, where eos is forced;
- the maximum length is a * src_len + b (src_len counts the source eos), capped by the model's
  positions; eos is not allowed at the first step (fairseq min_len=1); pad and bos never are.

Decoding is batched over sentences and beams and incremental: each decoder layer caches its
self-attention keys/values, cross-attention keys/values are computed and read once per sentence
(its beams attend as one group of queries; fairseq copies them per beam), and finished sentences
leave the batch, so later steps compute live beams only.

A step reads the device once (_to_host: which sentences finished, which cache rows moved); every
other decision is made on the host from lengths it already knows, or on the device without
reading it back, so on CUDA the host can queue the next step's kernels while the GPU runs.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch.nn import functional as F

from runner.console import track
from runner.data.dataset import TokenizedSplit

NEG_INF = float("-inf")


# ----------------------------------------------------------------------------- search
@dataclass
class Hypotheses:
    """Best hypothesis per sentence, in the order the sentences were given."""

    tokens: list[list[int]]  # without the final eos
    scores: list[float]  # normalised: sum of log-probs / (len + 1) ** lenpen


def _max_lengths(src_tokens: torch.Tensor, pad: int, max_len_a: float, max_len_b: int,
                 max_positions: int, batch_max_len: bool) -> tuple[np.ndarray, torch.Tensor]:
    """Per sentence, the most tokens generated before eos is forced: on the host, and a copy on
    the device of src_tokens.

    batch_max_len=True reproduces fairseq-generate exactly, whose src_len is the batch's padded
    width (so the cap depends on the batching); the default uses each sentence's own length,
    which is what fairseq gives a batch of one, and does not depend on the batching."""
    if batch_max_len:
        src_len = torch.full((src_tokens.shape[0],), src_tokens.shape[1], dtype=torch.float64)
    else:
        src_len = (src_tokens != pad).sum(1).double().cpu()
    cap = (max_len_a * src_len + max_len_b).floor().long()
    # positions 0..max_len are fed to the decoder; at least one real token before eos
    cap = cap.clamp(min=1, max=max_positions - 1)
    return cap.numpy(), cap.to(src_tokens.device)


def _to_host(flags: torch.Tensor) -> np.ndarray:
    """The one read of the device in a decode step (on CUDA the host waits here for the GPU).
    What the host keeps is numpy, what the device computes is torch: the two never mix."""
    return flags.cpu().numpy()


def _mask_special(lprobs: torch.Tensor, step: int, force_eos: Optional[torch.Tensor],
                  pad: int, bos: int, eos: int) -> torch.Tensor:
    """In place on (rows, vocab) scores: never pad or bos, no eos first, eos where forced
    (force_eos: a bool per row, or None when the host knows that no row is forced)."""
    lprobs[:, pad] = NEG_INF
    lprobs[:, bos] = NEG_INF
    if step == 0:  # fairseq min_len=1: no empty hypotheses
        lprobs[:, eos] = NEG_INF
    if force_eos is not None:
        eos_col = lprobs[:, eos].clone()
        lprobs.masked_fill_(force_eos[:, None], NEG_INF)  # (boolean indexing would sync on CUDA)
        lprobs[:, eos] = eos_col
    return lprobs


def _cross_caches(model, memory: torch.Tensor, beams: int) -> list[dict]:
    """Decoder caches with cross-attention keys/values computed and stored once per sentence;
    the `beams` consecutive decoder rows of a sentence read them together (layout of
    runner/model/attention.py: cache["cross"] = {"k", "v", "group"})."""
    caches = []
    for layer in model.decoder.layers:
        k, v = layer.cross_attn.branch.project_kv(memory, contiguous=True)
        caches.append({"self": {}, "cross": {"k": k, "v": v, "group": beams}})
    return caches


def _rows(t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """t.index_select(0, rows); through a 2-D view when contiguous, which is several times
    faster on CPU for the 4-D cache tensors (torch 2.x)."""
    if t.is_contiguous():
        return t.view(t.shape[0], -1).index_select(0, rows).view(rows.shape[0], *t.shape[1:])
    return t.index_select(0, rows)


def _keep_in_place(parents: torch.Tensor) -> torch.Tensor:
    """parents: (sentences, beam) local parent beam of each continuing hypothesis, in rank
    order. Returns the slot each one moves to: the first child of a parent takes the parent's
    own slot, the other children fill the slots of parents that left no child. Beam order
    within a sentence does not change the search (only the tie order of equal scores), and a
    cache row whose hypothesis continues in place need not be copied."""
    k = parents.shape[1]
    beams = torch.arange(k, device=parents.device)
    child_of = parents[:, :, None] == beams  # (sentences, child, parent)
    first = child_of.long().cumsum(1).gather(2, parents[:, :, None]).squeeze(2) == 1
    free = (child_of.any(1).long() * k + beams).argsort(1)  # parents without a child first
    extra = ((~first).long().cumsum(1) - 1).clamp(min=0)
    return torch.where(first, parents, free.gather(1, extra))


def _reorder_rows(caches: list[dict], parents: torch.Tensor, moved: torch.Tensor) -> None:
    """Self-attention caches after a step without pruning: copy only the rows that take
    another row's hypothesis (`moved`, the rows where parents differs from the row), in place."""
    if moved.numel() == 0:
        return
    sources = parents[moved]
    for cache in caches:
        sub = cache["self"]
        for key, value in sub.items():
            if not torch.is_tensor(value):
                continue
            if value.is_contiguous():  # the whole buffer: one flat row copy beats a strided one
                flat = value.view(value.shape[0], -1)
                flat.index_copy_(0, moved, flat.index_select(0, sources))
            else:
                sub[key] = _rows(value, parents)


def _select(caches: list[dict], rows: torch.Tensor, part: str) -> None:
    for cache in caches:
        sub = cache[part]
        for key, value in sub.items():
            if torch.is_tensor(value):
                sub[key] = _rows(value, rows)


def _rows_where(flags: torch.Tensor, count: int) -> torch.Tensor:
    """The rows where the bool `flags` (on the device) is True, found without reading the
    device: the host already knows how many there are (nonzero would wait to find out)."""
    try:
        return torch.nonzero_static(flags, size=count).squeeze(1)
    except NotImplementedError:  # CUDA builds before torch 2.6 (pytorch/pytorch#141838)
        return flags.nonzero().squeeze(1)


def _rows_left(done: torch.Tensor, done_host: np.ndarray) -> tuple[np.ndarray, torch.Tensor]:
    """The rows not done, as host indices and as device indices."""
    keep_host = np.flatnonzero(~done_host)
    return keep_host, _rows_where(~done, keep_host.size)


@torch.inference_mode()
def greedy_search(model, src_tokens: torch.Tensor, pad: int, bos: int, eos: int,
                  max_len_a: float = 0.0, max_len_b: int = 200, lenpen: float = 1.0,
                  batch_max_len: bool = False) -> Hypotheses:
    """Argmax decoding (equal to beam_search with beam=1, but without candidate bookkeeping)."""
    model.eval()
    device = src_tokens.device
    n = src_tokens.shape[0]
    has_pad = bool((src_tokens == pad).any())
    memory, mask = model.encode(src_tokens, has_pad)
    caches = _cross_caches(model, memory, 1)
    max_len_host, max_len = _max_lengths(src_tokens, pad, max_len_a, max_len_b,
                                         model.cfg.max_positions, batch_max_len)
    longest = int(max_len_host.max())
    out = torch.full((n, longest + 1), pad, dtype=torch.long, device=device)
    score = torch.zeros(n, dtype=torch.float32, device=device)
    alive = torch.arange(n, device=device)  # original index of each live row
    alive_host = np.arange(n)
    prev = torch.full((n, 1), eos, dtype=torch.long, device=device)
    for step in range(longest + 1):
        logits = model.decode(prev, memory, mask, caches, start=step)[:, -1].float()
        forced = bool((max_len_host[alive_host] <= step).any())  # on the host: no wait
        lprobs = _mask_special(F.log_softmax(logits, -1), step,
                               max_len[alive] <= step if forced else None, pad, bos, eos)
        best_lp, tok = lprobs.max(-1)
        score[alive] += best_lp
        out[alive, step] = tok
        done = tok == eos
        done_host = _to_host(done)
        if done_host.any():
            keep_host, keep = _rows_left(done, done_host)
            if keep_host.size == 0:
                break
            alive, alive_host, tok = alive[keep], alive_host[keep_host], tok[keep]
            _select(caches, keep, "self")
            _select(caches, keep, "cross")
            if mask is not None:
                mask = _rows(mask, keep)
        prev = tok[:, None]
    # a row's only eos is its last token (eos is forced at its cap); argmax finds the first
    final_len = (out == eos).long().argmax(1)
    lengths = final_len.tolist()
    rows = out.tolist()
    scores = (score / (final_len + 1).double().pow(lenpen).float()).tolist()
    return Hypotheses([row[:length] for row, length in zip(rows, lengths)], scores)


@torch.inference_mode()
def beam_search(model, src_tokens: torch.Tensor, beam: int, pad: int, bos: int, eos: int,
                lenpen: float = 1.0, max_len_a: float = 0.0, max_len_b: int = 200,
                batch_max_len: bool = False, use_cache: bool = True) -> Hypotheses:
    """Batched beam search (see the module docstring). use_cache=False recomputes the whole
    decoder prefix every step (the slow reference the cache is tested against)."""
    model.eval()
    device = src_tokens.device
    n, k = src_tokens.shape[0], beam
    has_pad = bool((src_tokens == pad).any())
    memory, mask = model.encode(src_tokens, has_pad)
    max_len_host, max_len = _max_lengths(src_tokens, pad, max_len_a, max_len_b,
                                         model.cfg.max_positions, batch_max_len)
    longest = int(max_len_host.max())
    if use_cache:  # the mask, like the cross caches, stays one row per sentence
        caches = _cross_caches(model, memory, k)
    else:
        caches, memory = None, memory.repeat_interleave(k, 0)
        if mask is not None:
            mask = mask.repeat_interleave(k, 0)

    sent = torch.arange(n, device=device)  # original index of each live sentence
    sent_host = np.arange(n)  # the same, on the host
    tokens = torch.full((n * k, longest + 2), eos, dtype=torch.long, device=device)
    # Only the first beam is live at step 0 (all beams hold the same prefix).
    scores = torch.full((n, k), NEG_INF, device=device)
    scores[:, 0] = 0.0
    scores = scores.view(-1)
    n_final = torch.zeros(n, dtype=torch.long, device=device)
    best_score = torch.full((n,), NEG_INF, device=device)
    best_len = torch.zeros(n, dtype=torch.long, device=device)
    best_tokens = torch.full((n, longest + 1), pad, dtype=torch.long, device=device)
    cand_rank = torch.arange(2 * k, device=device)

    for step in range(longest + 1):
        if use_cache and step == 0 and k > 1:
            # Every beam holds the same prefix: run one row per sentence, then copy its cache
            # rows to the other beams (whose scores are -inf at this step anyway).
            for cache in caches:
                cache["cross"]["group"] = 1
            logits = model.decode(tokens[::k, :1], memory, mask, caches, start=0)
            for layer, cache in zip(model.decoder.layers, caches):
                cache["cross"]["group"] = k
                layer.self_attn.branch.repeat_cache(cache["self"], k)
            lprobs = F.log_softmax(logits[:, -1].float(), -1).repeat_interleave(k, 0)
        else:
            if use_cache:
                logits = model.decode(tokens[:, step:step + 1], memory, mask, caches, start=step)
            else:
                logits = model.decode(tokens[:, :step + 1], memory, mask)
            # (torch.logsumexp is many times slower than the fused log_softmax kernel on CPU)
            lprobs = F.log_softmax(logits[:, -1].float(), -1)
        vocab = lprobs.shape[-1]
        cand = lprobs.add_(scores[:, None])
        forced = bool((max_len_host[sent_host] <= step).any())  # on the host: no wait
        at_cap = max_len[sent] <= step if forced else None
        cand = _mask_special(cand, step, at_cap.repeat_interleave(k) if forced else None,
                             pad, bos, eos)
        live = sent.shape[0]
        cand = cand.view(live, k * vocab)
        top_score, top_index = cand.topk(2 * k, dim=1)
        top_beam = torch.div(top_index, vocab, rounding_mode="floor")
        top_token = top_index - top_beam * vocab
        is_eos = (top_token == eos) & torch.isfinite(top_score)
        base = torch.arange(live, device=device)

        # Finalise eos among the top `beam` candidates, at most `beam` per sentence; a sentence
        # whose best finalised hypothesis improves copies its tokens (computed for every
        # sentence and kept where it improves, rather than asking the device which did).
        fin = is_eos[:, :k]
        accepted = fin & (n_final[:, None] + fin.cumsum(1) <= k)
        normed = torch.where(accepted, top_score[:, :k] / (step + 1) ** lenpen,
                             torch.full_like(top_score[:, :k], NEG_INF))
        m, arg = normed.max(1)
        best_here = best_score[sent]
        improve = m > best_here
        best_score[sent] = torch.where(improve, m, best_here)
        best_len[sent] = torch.where(improve, step, best_len[sent])
        if step > 0:
            parent = top_beam.gather(1, arg[:, None]).squeeze(1) + base * k
            best_tokens[sent, :step] = torch.where(improve[:, None], tokens[parent, 1:step + 1],
                                                   best_tokens[sent, :step])
        n_final += accepted.sum(1)
        finished = n_final >= k if at_cap is None else (n_final >= k) | at_cap

        # Continue with the first `beam` candidates that are not a finished eos.
        order = (is_eos.long() * (2 * k) + cand_rank).topk(k, dim=1, largest=False).indices
        next_beam = top_beam.gather(1, order)
        next_token = top_token.gather(1, order)
        next_score = top_score.gather(1, order)
        if use_cache and k > 1:
            slot = _keep_in_place(next_beam)
            next_beam = torch.empty_like(next_beam).scatter_(1, slot, next_beam)
            next_token = torch.empty_like(next_token).scatter_(1, slot, next_token)
            next_score = torch.empty_like(next_score).scatter_(1, slot, next_score)
        parents = (next_beam + base[:, None] * k).view(-1)
        moved = parents != torch.arange(live * k, device=device)
        flags_host = _to_host(torch.cat([finished, moved]))
        finished_host, moved_host = flags_host[:live], flags_host[live:]
        pruned = bool(finished_host.any())
        if pruned:
            keep_host, keep = _rows_left(finished, finished_host)
            if keep_host.size == 0:
                break
            next_beam, next_token, next_score = next_beam[keep], next_token[keep], next_score[keep]
            sent, sent_host, n_final = sent[keep], sent_host[keep_host], n_final[keep]
            parents = (next_beam + keep[:, None] * k).view(-1)
            if use_cache:
                _select(caches, keep, "cross")
                if mask is not None:
                    mask = _rows(mask, keep)
            else:
                sentence_rows = (keep[:, None] * k + torch.arange(k, device=device)).view(-1)
                memory = _rows(memory, sentence_rows)
                if mask is not None:
                    mask = _rows(mask, sentence_rows)
        tokens = _rows(tokens, parents)
        tokens[:, step + 1] = next_token.view(-1)
        scores = next_score.view(-1)
        if use_cache:
            if pruned:
                _select(caches, parents, "self")
            else:
                _reorder_rows(caches, parents, _rows_where(moved, int(moved_host.sum())))

    lengths = best_len.tolist()
    rows = best_tokens.tolist()
    return Hypotheses([row[:length] for row, length in zip(rows, lengths)], best_score.tolist())


def generate(model, src_tokens: torch.Tensor, beam: int, pad: int, bos: int, eos: int,
             **kwargs) -> Hypotheses:
    if beam == 1:
        kwargs.pop("use_cache", None)
        return greedy_search(model, src_tokens, pad, bos, eos, **kwargs)
    return beam_search(model, src_tokens, beam, pad, bos, eos, **kwargs)


# ----------------------------------------------------------------------------- a whole split
def decode_batches(split: TokenizedSplit, max_tokens: int, batch_size: int) -> list[np.ndarray]:
    """Sentences sorted by source length, grouped so rows x longest source <= max_tokens and
    rows <= batch_size (little padding, and similar lengths finish together)."""
    lengths = split.src_lengths
    order = np.argsort(lengths, kind="stable")
    batches, start = [], 0
    while start < len(order):
        end = start + 1
        while (end < len(order) and end - start < batch_size
               and int(lengths[order[end]]) * (end - start + 1) <= max_tokens):
            end += 1
        batches.append(order[start:end])
        start = end
    return batches


def _src_batch(split: TokenizedSplit, indices: np.ndarray, pad: int) -> torch.Tensor:
    rows = [split.source(i) for i in indices]
    out = np.full((len(rows), max(len(r) for r in rows)), pad, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return torch.from_numpy(out)


def decode_split(model, split: TokenizedSplit, beam: int = 5, lenpen: float = 1.0,
                 max_len_a: float = 0.0, max_len_b: int = 200, max_tokens: int = 4096,
                 batch_size: int = 128, batch_max_len: bool = False,
                 device: torch.device | str = "cpu", pad: int = 1, bos: int = 0,
                 eos: int = 2, batches: Optional[list[np.ndarray]] = None,
                 progress: Optional[bool] = None) -> Hypotheses:
    """Decode every source sentence of `split` (or those in `batches`, batched so, instead of
    decode_batches(split, max_tokens, batch_size)); results in the split's order, None for a
    sentence no batch holds. progress: a sentences-decoded bar (None: when the console is a
    terminal; runner.console.track)."""
    tokens: list[Optional[list[int]]] = [None] * len(split)
    scores = [0.0] * len(split)
    if batches is None:
        batches = decode_batches(split, max_tokens, batch_size)
    for indices in track(batches, f"decode (beam {beam})", total=sum(len(b) for b in batches),
                         advance=len, enabled=progress):
        src = _src_batch(split, indices, pad).to(device)
        hyps = generate(model, src, beam, pad, bos, eos, lenpen=lenpen, max_len_a=max_len_a,
                        max_len_b=max_len_b, batch_max_len=batch_max_len)
        for i, toks, score in zip(indices, hyps.tokens, hyps.scores):
            tokens[i], scores[i] = toks, score
    return Hypotheses(tokens, scores)  # type: ignore[arg-type]


def decode_throughput(model, split: TokenizedSplit, beam: int = 5, max_len_a: float = 1.0,
                      max_len_b: int = 0, max_tokens: int = 4096, batch_size: int = 128,
                      batch_max_len: bool = True, lenpen: float = 1.0,
                      device: torch.device | str = "cpu", repeats: int = 1,
                      batches: Optional[list[np.ndarray]] = None) -> dict:
    """Sentences/s decoding `split` (for the benchmark). The defaults mirror the peer's
    fairseq-generate call (the peer script peer_train_bench.sh, `deepinit bench --peer-tools`: --max-tokens 4096
    --batch-size 128 --max-len-a 1.0 --max-len-b 0, the cap from the batch's padded width), so
    an untrained model's output length, and hence the work, is the same on both sides when
    `batches` are fairseq's (runner.bench.corpus.fairseq_generate_batches).
    Returns the median over `repeats` of sentences/s, and generated tokens/s."""
    device = torch.device(device)
    model = model.to(device).select_kernels(device.type).eval()
    sentences = len(split) if batches is None else sum(len(b) for b in batches)
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        hyps = decode_split(model, split, beam=beam, lenpen=lenpen, max_len_a=max_len_a,
                            max_len_b=max_len_b, max_tokens=max_tokens, batch_size=batch_size,
                            batch_max_len=batch_max_len, device=device, batches=batches,
                            progress=False)  # timed: no bar
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        generated = sum(len(t) + 1 for t in hyps.tokens if t is not None)
        runs.append((sentences / seconds, generated / seconds, seconds))
    runs.sort()
    mid = runs[len(runs) // 2]
    return {"sentences_per_s": mid[0], "tokens_per_s": mid[1], "seconds": mid[2],
            "sentences": sentences, "generated_tokens": round(mid[1] * mid[2]), "beam": beam,
            "runs": [r[0] for r in runs]}
