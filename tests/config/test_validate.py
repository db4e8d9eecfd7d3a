"""Every option composes; bad input is rejected with one line and exit code 2."""
from __future__ import annotations

import pytest

from runner.config import ConfigError
from runner.run.build import check_config
from tests.conftest import REPO, compose, run_cli_all, run_cli_here

GROUPS = ["model", "norm", "init", "optim", "schedule", "warmup", "data", "trainer"]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (REPO / "conf" / group).glob("*.yaml"))


# The options that need another choice beside the defaults: (the fix their one-line error names,
# the overrides that make the option valid). Every other option validates with the defaults.
NEEDS_ANOTHER = {
    ("init", "depth_mup"): ("use norm=pre", ["norm=pre"]),
    ("init", "layerscale"): ("use norm=pre or norm=sandwich", ["norm=pre"]),
    ("init", "lipschitz"): ("use norm.embedding_norm=true", ["norm.embedding_norm=true"]),
    ("init", "rezero"): ("use norm=none", ["norm=none"]),
    ("init", "rezero_ramp"): ("use norm=none", ["norm=none"]),
    ("init", "skipinit"): ("use norm=none", ["norm=none"]),
    ("init", "tfixup"): ("use norm=none", ["norm=none"]),
    ("data", "shakespeare_char"): ("use task=lm", ["task=lm"]),
    ("data", "text"): ("use task=lm", ["task=lm"]),
}


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_of_every_group_composes(group):
    found = options(group)
    assert found, f"conf/{group} has no options"
    for option in found:
        overrides = [f"{group}={option}", "trainer.max_updates=100000"]
        if (group, option) not in NEEDS_ANOTHER:
            check_config(compose(overrides))
            continue
        fix, fixed = NEEDS_ANOTHER[group, option]
        with pytest.raises(ConfigError) as err:
            check_config(compose(overrides))
        assert fix in str(err.value) and "\n" not in str(err.value), err.value
        check_config(compose(overrides + fixed))  # the fix the error names is enough
    assert {o for g, o in NEEDS_ANOTHER if g == group} <= set(found)


def test_names_that_scripts_rely_on():
    cfg = compose(["trainer.max_updates=7", "trainer.max_epochs=3", "trainer.seed=5",
                   "trainer.device=cpu", "model=small", "model.layers=18", "norm=pre",
                   "init=xavier", "optim=radam", "optim.lr=3e-4", "optim.beta1=0.8",
                   "optim.beta2=0.995", "warmup=none", "data=toy"])
    assert (cfg.trainer.max_updates, cfg.trainer.max_epochs, cfg.trainer.seed) == (7, 3, 5)
    assert cfg.model.num_encoder_layers == cfg.model.num_decoder_layers == 18
    assert (cfg.model.dim, cfg.model.ffn_dim, cfg.model.heads) == (512, 1024, 4)
    assert (cfg.optim.name, cfg.optim.lr, cfg.optim.beta1, cfg.optim.beta2) == ("radam", 3e-4, 0.8, 0.995)
    assert cfg.warmup.updates == 0 and cfg.norm.placement == "pre"
    cfg = compose(["warmup.updates=6000", "model.encoder_layers=12", "model.decoder_layers=3"])
    assert cfg.warmup.updates == 6000
    assert (cfg.model.num_encoder_layers, cfg.model.num_decoder_layers) == (12, 3)


def test_size_presets_match_the_papers():
    """fairseq's transformer_iwslt_de_en (small) and transformer_wmt_en_de (base)
    (fairseq/models/transformer.py), T-Fixup's big and its 64-128-2 ultra-deep width (Huang et al.
    2020, Fig. 4(b)); tiny is that width at 6+6 layers."""
    expected = {"small": (512, 1024, 4), "base": (512, 2048, 8), "big": (1024, 4096, 16),
                "ultradeep": (64, 128, 2), "tiny": (64, 128, 2)}
    for preset, dims in expected.items():
        cfg = compose([f"model={preset}"])
        assert (cfg.model.dim, cfg.model.ffn_dim, cfg.model.heads) == dims


@pytest.mark.parametrize("overrides, key", [
    (["model.layers=-1"], "model.layers"),
    (["model.encoder_layers=0"], "model.encoder_layers"),
    (["schedule=linear", "schedule.min_lr=-1"], "schedule.min_lr"),
    (["warmup.updates=5000", "trainer.max_updates=100"], "warmup.updates"),
    (["optim.lr=0"], "optim.lr"),
    (["optim.beta2=1.5"], "optim.beta2"),
    (["model.dim=30", "model.heads=4"], "model.dim"),
    (["norm.kind=batchnorm"], "norm.kind"),
    (["norm=none", "norm.final_norm=true"], "norm=none"),
    (["model.share_embeddings=all", "data.joined_dictionary=false"], "model.share_embeddings"),
    (["trainer.device=cpu", "trainer.precision=fp16"], "trainer.precision"),
    (["trainer.compile_scope=blocks"], "trainer.compile_scope"),
    (["trainer.compile=true", "trainer.telemetry_interval=5"], "trainer.telemetry_interval"),
    (["init=no_such_scheme"], None),
])
def test_impossible_combinations_name_the_key(overrides, key):
    if key is None:  # an unknown group option is Hydra's error, at composition
        with pytest.raises(Exception):
            compose(overrides)
        return
    cfg = compose(overrides)
    with pytest.raises(ConfigError) as err:
        check_config(cfg)
    assert key in str(err.value)
    assert "\n" not in str(err.value)


BAD_INPUT = [
    (["model.no_such_key=1"], "no_such_key"),
    (["trainer.max_updates=abc"], "max_updates"),
    (["norm=diagonal"], "norm"),
    (["model.layers=-2"], "model.layers"),
    (["warmup.updates=500", "trainer.max_updates=10"], "warmup.updates"),
    (["schedule=linear", "schedule.min_lr=-0.1"], "schedule.min_lr"),
    (["trainer.early_stop.min_delta=-0.5"], "trainer.early_stop.min_delta"),
    (["-m", "optim.lr=1e-4,5e-4", "--cfg", "job"], "Only one of"),  # Hydra's own flag check
]


@pytest.fixture(scope="module")
def bad_input_runs(tmp_path_factory) -> dict:
    """`deepinit train ARGS hydra.run.dir=FOLDER/run` for each bad input, each in its own folder:
    {tuple(ARGS): (FOLDER, the finished command)}. The first runs in a process of its own (the exit
    code and stderr at the process boundary); the others through the same entry point in this
    process (run_cli_here), which saves an interpreter's start-up each."""
    folders = {tuple(args): tmp_path_factory.mktemp("bad_input") for args, _ in BAD_INPUT}
    first, *rest = folders
    procs = run_cli_all({first: (["train", *first, f"hydra.run.dir={folders[first] / 'run'}"], folders[first])})
    for key in rest:
        procs[key] = run_cli_here(["train", *key, f"hydra.run.dir={folders[key] / 'run'}"], folders[key])
    return {key: (folders[key], procs[key]) for key in folders}


@pytest.mark.parametrize("args, needle", BAD_INPUT)
def test_cli_bad_input_exit_2_no_traceback(bad_input_runs, args, needle):
    tmp_path, proc = bad_input_runs[tuple(args)]
    run_dir = tmp_path / "run"
    assert proc.returncode == 2, proc.stderr + proc.stdout
    text = proc.stderr + proc.stdout
    assert needle in text
    assert "Traceback" not in text
    # Nothing is left in the run folder but the error in train.log.
    if run_dir.exists():
        left = sorted(p.name for p in run_dir.iterdir())
        assert left == ["train.log"], left
        assert needle in (run_dir / "train.log").read_text()


# ------------------------------------------------- the registries against the config, conf/ and docs
def _override_list(text: str, group: str) -> list[str]:
    """The options of the first `group=a|b|c` override list in a document."""
    import re

    found = re.search(rf"`{group}=([\w|]+)`", text)
    assert found, f"no `{group}=...|...` list"
    return found[1].split("|")


def test_placements_are_the_slot_table_everywhere():
    """One list of placements: PLACEMENTS (runner/model/sublayer.py) is the registry; the config's
    Literal, conf/norm's options and the README's and docs' lists are checked against it."""
    import yaml

    from runner.config import NormConfig
    from runner.config.options import choices
    from runner.model.sublayer import PLACEMENTS

    placements = list(choices(NormConfig)["placement"])  # the Literal's order, the docs' order
    assert sorted(placements) == sorted(PLACEMENTS)
    placed = {p.stem: yaml.safe_load(p.read_text()).get("placement") for p in (REPO / "conf" / "norm").glob("*.yaml")}
    assert set(PLACEMENTS) <= set(placed), "a placement without conf/norm/<name>.yaml"
    assert {v for v in placed.values() if v is not None} <= set(PLACEMENTS)
    assert all(placed[name] == name for name in PLACEMENTS)  # norm=<placement> sets that placement
    # a placement with options of its own: conf/norm/<name>.yaml names their schema
    from runner.model.sublayer import PLACEMENT_OPTIONS
    for name in PLACEMENT_OPTIONS:
        data = yaml.safe_load((REPO / "conf" / "norm" / f"{name}.yaml").read_text())
        assert data["defaults"][0] == f"/norm_options/{name}@_here_", name
    readme = (REPO / "README.md").read_text()
    assert _override_list(readme, "norm") == [*placements, *sorted(set(placed) - set(PLACEMENTS))]
    assert sorted(_override_list((REPO / "docs" / "lm.md").read_text(), "norm")) == sorted(PLACEMENTS)


def test_init_schemes_are_the_registry_everywhere():
    """SCHEMES (runner/init/__init__.py) is the registry: every scheme has conf/init/<name>.yaml
    naming its options' schema, and the README's and docs/methods.md's lists are the registry's."""
    import re

    import yaml

    from runner.init import SCHEMES

    for name in SCHEMES:
        data = yaml.safe_load((REPO / "conf" / "init" / f"{name}.yaml").read_text())
        assert data["name"] == name and data["defaults"][0] == f"/init_options/{name}@_here_", name
        assert SCHEMES[name].name == name
    assert options("init") == sorted(SCHEMES)
    assert _override_list((REPO / "README.md").read_text(), "init") == list(SCHEMES)
    methods = (REPO / "docs" / "methods.md").read_text()
    table = re.findall(r"^\| `(\w+)` \|", methods.split("\n## ", 1)[0], flags=re.M)
    assert table == list(SCHEMES), "docs/methods.md's table of schemes"
    assert all(f"runner/init/{name}.py" in methods for name in SCHEMES)


def test_init_options_are_typed_per_scheme():
    """A scheme's option fails as an unknown key under another scheme and a wrong choice in one
    line naming the allowed values; a stored config with the old flat init fields still loads."""
    from runner.config import config_from_dict, to_dict
    from runner.init import options_class
    from runner.init.admin import AdminOptions
    from runner.model.sublayer import norm_options_class

    with pytest.raises(ConfigError, match=r"unknown key init\.omega \(an option of init=admin and "
                                          r"init=admin_torch: choose that scheme first\); init has: name$"):
        compose(["init.omega=scalar"])
    with pytest.raises(ConfigError) as err:
        check_config(compose(["init=admin", "init.omega=scaler"]))
    assert str(err.value) == "init.omega='scaler': expected one of vector, scalar, constant"
    cfg = compose(["init=admin_torch", "init.omega=scalar", "init.output_change_scale='O(1)'"])
    assert type(cfg.init).__name__ == "AdminTorchOptions" and isinstance(cfg.init, AdminOptions)
    assert config_from_dict(to_dict(cfg), options_class, norm_options_class) == cfg
    legacy = to_dict(compose(["init=admin"]))
    legacy["init"].update(lipschitz_scale=1.0, deepnorm_variant="paper", alpha_ramp_step=0.0)
    assert config_from_dict(legacy, options_class, norm_options_class).init == AdminOptions(name="admin")
    with pytest.raises(ConfigError, match="not a deepinit config"):
        config_from_dict({"init": {"name": "admin", "omegaa": "vector"}}, options_class, norm_options_class)


def test_norm_options_are_typed_per_placement():
    """A placement's option fails as an unknown key where no stack uses that placement; stacks
    with two placements that have options get both; stored configs, the old flat ones included,
    load back with the class of the placements they use, and a config pickles (DDP workers)."""
    import pickle

    from runner.config import config_from_dict, to_dict
    from runner.init import options_class
    from runner.model.sublayer import B2TOptions, MixOptions, ResiDualOptions, norm_options_class

    with pytest.raises(ConfigError, match=r"unknown key norm\.mix_ratio \(an option of norm=mix: "
                                          r"choose that placement first;"):
        compose(["norm=pre", "norm.mix_ratio=0.5"])
    cfg = compose(["norm=mix", "norm.mix_ratio=0.5"])
    assert type(cfg.norm) is MixOptions and cfg.norm.mix_ratio == 0.5
    assert type(compose(["norm=pre"]).norm).__name__ == "NormConfig"
    both = compose(["norm=resi_dual", "norm.decoder_placement=b2t", "norm.resi_dual_scale=0.05"])
    assert isinstance(both.norm, ResiDualOptions) and isinstance(both.norm, B2TOptions)
    assert both.norm.resi_dual_scale == 0.05 and both.norm.b2t_rescale_init is True
    assert type(compose(["norm=pre", "norm.placement=mix"]).norm) is MixOptions  # defaults start
    for config in (cfg, both):
        assert config_from_dict(to_dict(config), options_class, norm_options_class) == config
        assert pickle.loads(pickle.dumps(config)) == config
    legacy = to_dict(compose(["norm=pre"]))
    legacy["norm"].update(mix_ratio=0.25, resi_dual_scale=1.0, resi_dual_alpha=1.0, b2t_rescale_init=True)
    assert config_from_dict(legacy, options_class, norm_options_class).norm == compose(["norm=pre"]).norm
    with pytest.raises(ConfigError, match="norm.mix_ratio=1.5: expected a value in"):
        check_config(compose(["norm=mix", "norm.mix_ratio=1.5"]))
    with pytest.raises(ConfigError, match=r"norm.kind='foo': expected one of layernorm"):
        check_config(compose(["norm=mix", "norm.kind=foo"]))  # the base's Literal, checked in a subclass
