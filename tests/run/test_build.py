"""runner/run/build.py: how a run is put together from its config (the compile wrapper here; the
rest is exercised by every training test)."""
from __future__ import annotations

import pytest
import torch

from runner.run import build
from tests.conftest import compose


@pytest.mark.parametrize("task,dynamic", [("translation", True), ("lm", None)])
def test_compile_is_dynamic_for_translation_batches_and_static_for_lm_blocks(task, dynamic, monkeypatch):
    """trainer.compile=true: translation batches change shape every update, so their graphs are
    compiled dynamic from the first call (no graph specialized to the first batch and thrown
    away); the LM's blocks have one shape and stay specialized."""
    seen = {}

    def fake_compile(module, **kwargs):  # what build asks torch.compile for, without compiling
        seen.update(kwargs)
        return module

    monkeypatch.setattr(torch, "compile", fake_compile)
    cfg = compose(["trainer.compile=true", *((["task=lm", "data=shakespeare_char"]) if task == "lm" else [])])
    model = torch.nn.Linear(2, 2)
    model.select_kernels = lambda device_type: None
    build.on_device(model, cfg, torch.device("cpu"), world=1)
    assert seen == {"dynamic": dynamic}



def test_compile_scope_layers_compiles_each_layer_for_training_only(monkeypatch):
    """trainer.compile_scope=layers: training calls every encoder and decoder layer through its
    own compiled call; the model itself is not wrapped, its state dict keeps its keys, and
    validation and decoding (eval mode) and a train-mode forward without gradients call the
    layers themselves."""
    calls = []

    class Counted(torch.nn.Module):  # stands for torch.compile's wrapper: counts the calls
        def __init__(self, layer):
            super().__init__()
            self.layer = layer

        def forward(self, *args, **kwargs):
            calls.append(self.layer)
            return self.layer(*args, **kwargs)

    monkeypatch.setattr(torch, "compile", lambda module, **kwargs: Counted(module))
    parts = build.build_run(compose(["trainer.compile=true", "trainer.compile_scope=layers", "model.layers=3"]))
    model = parts.model
    assert parts.forward is model
    assert set(model.state_dict()) == set(build.build_run(compose(["model.layers=3"])).model.state_dict())
    src, prev = torch.randint(4, 20, (2, 5)), torch.randint(4, 20, (2, 4))
    model.train()
    model(src, prev)
    assert calls == [*model.encoder.layers, *model.decoder.layers]  # each once, in order
    calls.clear()
    model.eval()
    with torch.no_grad():
        model(src, prev)
    model.train()
    with torch.no_grad():  # an analysis's train-mode forward (deepinit analyze mode-gap)
        model(src, prev)
    assert calls == []


@pytest.mark.parametrize("scope", ["model", "layers"])
def test_compiled_nodes_grow_with_depth_only_for_the_whole_model(scope, monkeypatch):
    """The graph nodes dynamo hands the compiler (a counting backend in place of Inductor, the
    same tracing) in 2 training updates at 1 and at 2 layers per stack: one graph of the whole
    model grows with depth, while the layers of a stack share one compiled code, so with
    trainer.compile_scope=layers a deeper model costs no more compilation."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from runner.train.loop import Trainer

    nodes = []

    def counting(gm, example_inputs):
        nodes.append(len(gm.graph.nodes))
        return gm.forward

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda module, **kw: real(module, backend=counting, **kw))
    compiled = {}
    for layers in (1, 2):
        torch._dynamo.reset()
        counters.clear()
        nodes.clear()
        cfg = compose(["trainer.compile=true", f"trainer.compile_scope={scope}", f"model.layers={layers}",
                       "trainer.device=cpu", "trainer.unpad=false"])
        trainer = Trainer(build.build_run(cfg))
        for _ in range(2):
            trainer.step()
        assert not counters["graph_break"], dict(counters["graph_break"])
        compiled[layers] = sum(nodes)
    torch._dynamo.reset()
    assert compiled[1] > 0
    if scope == "layers":
        assert compiled[2] == compiled[1]
    else:
        assert compiled[2] > 1.5 * compiled[1]


@pytest.mark.parametrize("scope,graphs", [("model", 1), ("layers", 2)])
def test_compiled_training_needs_no_second_graph_for_a_batch_without_source_padding(scope, graphs, monkeypatch):
    """The source-padding flag is a Python bool, so each of its values would be a graph of its
    own: with trainer.compile, training passes a mask for every batch, and a batch without
    padding after one with padding compiles nothing new (one graph of the whole model, or one of
    the encoder layer and one of the decoder layer). With the flag passed as it is, the same two
    batches compile twice as many graphs."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from runner.data.batching import collate
    from runner.train.loop import Trainer

    compiled = []

    def counting(gm, example_inputs):  # a dynamo backend that counts the graphs it is handed
        compiled.append(gm)
        return gm.forward

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda module, **kw: real(module, backend=counting, **kw))
    cfg = compose(["trainer.compile=true", f"trainer.compile_scope={scope}", "model.layers=1",
                   "trainer.device=cpu", "trainer.unpad=false"])
    counts = {}
    for always in (True, False):
        torch._dynamo.reset()
        counters.clear()
        compiled.clear()
        parts = build.build_run(cfg)
        assert parts.src_mask_always is True
        parts.cfg.trainer.compile = always  # the model is compiled already; training reads the flag
        assert parts.src_mask_always is always
        trainer = Trainer(parts)
        split = parts.train_split
        by_length = {}
        for i, n in enumerate(split.src_lengths):
            by_length.setdefault(int(n), []).append(i)
        same = next(v for v in by_length.values() if len(v) >= 3)[:3]  # no padding
        mixed = [v[0] for v in list(by_length.values())[:3]]  # three source lengths: padding
        batches = [collate(split, idx, parts.pad, parts.eos) for idx in (mixed, same)]
        assert [b.src_has_pad for b in batches] == [True, False]
        for batch in batches:
            loss, _ = trainer.micro_batch_loss(parts.forward, batch, unpad=False)
            loss.backward()
        assert not counters["graph_break"], dict(counters["graph_break"])
        counts[always] = len(compiled)
    torch._dynamo.reset()
    assert counts == {True: graphs, False: 2 * graphs}
