"""The all-schemes table gathers several suites' arms into one table per warmup setting: this
holds only if those suites train the same recipe, so the recipe test composes every arm; the
table's rows, order and notes are checked on hand-made records; the command writes the page
from results/ and trains nothing."""
from __future__ import annotations

import dataclasses
import functools
import json
import os

from runner.cli.compose import compose
from runner.tables import suite
from runner.tables.all_schemes import ALL_SCHEMES_SECTIONS, all_schemes_cells
from runner.tables.combined import TableRows, render_combined
from runner.tables.report import arms_of
from runner.tables.targets import TARGETS
from tests.conftest import run_cli_here


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


@functools.lru_cache(maxsize=None)
def _composed(overrides: tuple[str, ...]) -> dict:
    """Composed once per set of overrides: the recipe test asks for the defaults and each method's
    settings once per arm."""
    cfg = _flat(dataclasses.asdict(compose(list(overrides))))
    if cfg["model.qk_norm"] == "none":  # the temperature is read only by QK-norm
        cfg.pop("model.qk_norm_temperature")
    return cfg


def _config(overrides) -> dict:
    return dict(_composed(tuple(overrides)))


def _method_settings(method: str) -> dict:
    """The keys that `method=NAME` changes from the defaults, with the values it sets: the
    method's own options."""
    base, alone = _config([]), _config([f"method={method}"])
    return {k: alone.get(k) for k in base.keys() | alone.keys() if base.get(k) != alone.get(k)}


def test_every_row_of_a_section_trains_the_same_recipe_but_the_options_its_method_sets():
    # the preset's sweep block and the seed are no part of the recipe; QK-norm's preset sets the
    # temperature for the data (conf/method/qk_norm.yaml says how), so its value is the preset's
    free = {"trainer.seed", "model.qk_norm_temperature"}
    checked = 0
    for heading, sources in ALL_SCHEMES_SECTIONS.items():
        reference = None
        for source in sources:
            cells = all_schemes_cells(source)  # what the table shows
            assert cells, (heading, source.target)
            assert {c.seed for c in cells} == {1, 2, 3}, (heading, source.target)  # the same seeds
            for arm, members in arms_of(cells).items():
                cfg = _config(members[0].overrides)
                if reference is None:  # the section's first arm: Table 2's Post-LN
                    reference = cfg
                    continue
                own = _method_settings(dict(arm)["method"])
                differ = {k for k in cfg.keys() | reference.keys()
                          if cfg.get(k) != reference.get(k) and k not in free and not k.startswith("sweep.")}
                # a difference is the method's only where the arm has the value the method sets
                unexplained = {k for k in differ if k not in own or cfg.get(k) != own[k]}
                assert not unexplained, (heading, source.target, arm,
                                         {k: (reference.get(k), cfg.get(k)) for k in unexplained})
                checked += 1
    assert checked >= 30


def test_the_sections_differ_in_warmup_only():
    without, with_ = ALL_SCHEMES_SECTIONS.values()
    pre = {name: _config(next(c for c in suite.plan(TARGETS["table2"].parts["real"][0].preset)
                              if c.arm == {"method": "pre_ln", "warmup.updates": updates}).overrides)
           for name, updates in (("without", "0"), ("with", "500"))}
    assert pre["without"]["warmup.updates"] == 0 and pre["with"]["warmup.updates"] == 500
    assert {k for k in pre["without"] if pre["without"][k] != pre["with"][k]} - {"sweep.name"} == {"warmup.updates"}
    assert without[0].select == {"warmup.updates": "0"} and with_[0].select == {"warmup.updates": "500"}


def _cell(arm: dict, seed: int, record=None) -> suite.SuiteCell:
    return suite.SuiteCell([], [f"{k}={v}" for k, v in arm.items()], dict(arm), seed, record)


def _ok(bleu: float) -> dict:
    return {"status": "ok", "bleu": bleu, "sacrebleu": bleu, "best_valid_loss": 3.0}


def test_rows_sort_by_failed_share_then_mean_bleu_with_untrained_arms_last():
    a = [_cell({"method": "a", "warmup.updates": "0"}, s, _ok(b)) for s, b in ((1, 10.0), (2, 12.0))]
    b = [_cell({"method": "b"}, 1, _ok(30.0)), _cell({"method": "b"}, 2)]
    c = [_cell({"method": "c"}, s, {"status": "diverged", "bleu": None, "best_valid_loss": None}) for s in (1, 2)]
    d = [_cell({"method": "d"}, 1)]
    e = [_cell({"method": "e"}, 1, _ok(40.0)), _cell({"method": "e"}, 2, {"status": "stalled", "bleu": 0.1})]
    page = render_combined("T", "intro", [("No warmup", [
        TableRows("s1", a, drop=("warmup.updates",)), TableRows("s2", c + d + e + b, note="uses SGD")])])
    rows = [line for line in page.splitlines() if line.startswith("| method=")]
    # b and a trained every seed they have; e (best BLEU, one seed stalled) comes after them
    assert [r.split(" | ")[0] for r in rows] == ["| method=b", "| method=a", "| method=e", "| method=c", "| method=d"]
    assert rows[0].split(" | ")[1:3] == ["s2", "1/2"]  # partial arms say so
    # the section's axis is dropped; diverged, collapsed, stalled, below the BLEU bar
    assert rows[1].startswith("| method=a | s1 | 2/2 | 0 | 0 | 0 | 0 | 11.00 ± 1.41")
    assert rows[2].split(" | ")[2:8] == ["2/2", "0", "0", "1", "0", "40.00 (n=1)"]
    assert rows[3].split(" | ")[2:4] == ["2/2", "2"]  # two diverged seeds
    assert "- method=b (s2): uses SGD" in page and "- method=a (s1)" not in page
    assert "7 of 9 cells have a record" in page


def test_each_row_is_compared_with_the_baseline_paired_by_seed_with_holm():
    from scipy import stats

    base = [_cell({"method": "pre_ln"}, s, _ok(b)) for s, b in ((1, 30.0), (2, 31.0), (3, 32.5))]
    up = [_cell({"method": "x"}, s, _ok(b)) for s, b in ((1, 31.0), (2, 31.6), (3, 33.9))]
    down = [_cell({"method": "y"}, s, _ok(b)) for s, b in ((1, 29.0), (2, 30.5), (3, 31.0))]
    part = TableRows("t2", base + up + down)
    page = render_combined("T", "intro", [("S", [part])], baseline=("t2", {"method": "pre_ln"}))
    rows = {line.split(" | ")[0]: line for line in page.splitlines() if line.startswith("| method=")}
    assert rows["| method=pre_ln"].rstrip(" |").endswith("baseline")
    p_up = stats.ttest_rel([31.0, 31.6, 33.9], [30.0, 31.0, 32.5]).pvalue
    p_down = stats.ttest_rel([29.0, 30.5, 31.0], [30.0, 31.0, 32.5]).pvalue
    holm_up = max(min(1, 2 * min(p_up, p_down)), p_up) if p_up > p_down else min(1, 2 * p_up)
    lo, hi = stats.t.interval(0.95, 2, loc=1.0, scale=stats.sem([1.0, 0.6, 1.4]))
    assert f"+1.00 [{lo:+.2f}, {hi:+.2f}] p={p_up:.2g}, Holm {holm_up:.2g}" in rows["| method=x"]
    assert "vs method=pre_ln: the row's BLEU (tok) minus the baseline's" in page


def test_the_command_writes_the_table_from_records_and_trains_nothing(tmp_path):
    cell = next(c for c in suite.plan("reproduce_schemes_norms_real") if c.arm == {"method": "b2t"})
    path = tmp_path / "schemes-norms" / "real" / "records.jsonl"
    path.parent.mkdir(parents=True)
    record = {"overrides": cell.key, "arm": cell.arm, "seed": cell.seed, "status": "ok", "bleu": 33.3,
              "sacrebleu": 33.2, "best_valid_loss": 3.1, "machine": {"git_commit": "abc"}}
    path.write_text(json.dumps(record) + "\n")
    env = {**os.environ, "DEEPINIT_RESULTS": str(tmp_path)}
    page_path = tmp_path / "all-schemes" / "real" / "report.md"
    dry = run_cli_here(["reproduce", "all-schemes", "--dry-run"], tmp_path, env=env)
    assert dry.returncode == 0 and "| method=b2t | schemes-norms | 1/3" in dry.stdout and not page_path.exists()
    r = run_cli_here(["reproduce", "all-schemes"], tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    page = page_path.read_text()
    assert "| method=b2t | schemes-norms | 1/3 | 0 | 0 | 0 | 0 | 33.30 (n=1)" in page
    assert not (tmp_path / "schemes-norms" / "real" / "report.md").exists()  # no suite ran
    bad = run_cli_here(["reproduce", "all-schemes", "--scale", "cpu"], tmp_path, env=env)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "all-schemes" in bad.stderr
    suites = run_cli_here(["reproduce", "all-schemes", "--suites", "table2"], tmp_path, env=env)
    assert suites.returncode == 2 and "--suites" in suites.stderr
    listed = run_cli_here(["reproduce", "list"], tmp_path, env=env).stdout.splitlines()
    assert [line.split()[0] for line in listed] == [*TARGETS, "all-schemes"]
    assert len({line.index(line.split()[1]) for line in listed}) == 1  # one column for the titles


def test_a_feeding_suites_report_rewrites_the_table(tmp_path):
    env = {**os.environ, "DEEPINIT_RESULTS": str(tmp_path)}
    r = run_cli_here(["reproduce", "schemes-norms", "--scale", "real", "--table-only"], tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "schemes-norms" / "real" / "report.md").is_file()
    assert "| method=b2t | schemes-norms | 0/3 |" in (tmp_path / "all-schemes" / "real" / "report.md").read_text()
    (tmp_path / "all-schemes" / "real" / "report.md").unlink()
    r = run_cli_here(["reproduce", "mup-transfer", "--scale", "real", "--table-only"], tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "all-schemes" / "real" / "report.md").exists()  # a suite outside the table


def test_the_lm_page_ranks_by_loss_and_sets_each_methods_rank_beside_translations(tmp_path, monkeypatch):
    """The LM page sorts by best validation loss (lower first), compares with its Pre-LN on it,
    and ends with each method's rank against Pre-LN in both tasks (rule book v2)."""
    from runner.tables import all_schemes

    def records(target, select, values):
        """records.jsonl of `target`'s planned cells that match `select`: {method: per-seed value}."""
        rows = []
        for cell in all_schemes.all_schemes_cells(all_schemes.TableSource(target, select)):
            value = values.get(cell.arm["method"], {}).get(cell.seed)
            if value is not None:
                key = "best_valid_loss" if target == "lm" else "bleu"
                rows.append({"overrides": cell.key, "arm": cell.arm, "seed": cell.seed, "status": "ok",
                             "bleu": None, "sacrebleu": None, "best_valid_loss": 1.5, key: value,
                             "machine": {"git_commit": "abc"}})
        return rows

    monkeypatch.setenv("DEEPINIT_RESULTS", str(tmp_path))
    lm = records("lm", {"warmup.updates": "100", "model.layers": "24", "optim.lr": "0.001"}, {
        "pre_ln": {1: 1.50, 2: 1.52, 3: 1.51}, "dyt": {1: 1.60, 2: 1.63, 3: 1.61},  # worse: higher loss
        "mix_ln": {1: 1.45, 2: 1.47, 3: 1.455}})  # better: lower loss
    translation = []
    for target, values in (("table2", {"pre_ln": {1: 35.0, 2: 35.5, 3: 36.0}}),
                           ("schemes-norms-warmup", {"dyt": {1: 30.0, 2: 30.4, 3: 31.1},
                                                     "mix_ln": {1: 35.1, 2: 35.4, 3: 36.2}})):
        select = {"warmup.updates": "500"} if target == "table2" else {}
        translation.append((target, records(target, select, values)))
    for target, rows in (("lm", lm), *translation):
        path = tmp_path / target / "real" / "records.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    page = all_schemes.render_lm_all_schemes()
    section = page.split("## With 100 warmup updates")[1].split("##")[0]
    order = [line.split(" | ")[0] for line in section.splitlines() if line.startswith("| method=")]
    assert order[:3] == ["| method=mix_ln", "| method=pre_ln", "| method=dyt"]  # lower loss first
    assert "vs method=pre_ln: the row's best valid loss minus the baseline's" in page
    ranks = page.split("## Rank against Pre-LN")[1]
    assert "- dyt: **agree**. Language model: worse (+0.10 [" in ranks  # worse in both tasks
    assert "translation: worse (-5.00 [" in ranks
    assert "- mix_ln: **detected in one task only**. Language model: better (-0.05 [" in ranks
    assert "translation: no difference detected" in ranks.split("- mix_ln")[1].splitlines()[0]
    assert "- ln_scaling: **undecided**. Language model: incomplete;" in ranks


def test_the_lm_table_leaves_out_the_added_controls_and_names_rows_by_method():
    """method=deepnorm_untied changes the tier's tied output and method=dyt_embed_scale its
    embeddings' scale, so neither is a scheme of the LM all-schemes table (nor of its Holm family
    against Pre-LN); the planned arms are, each row named by its method (a section that lists its
    methods still tells its rows apart by them)."""
    from runner.tables.all_schemes import LM_ALL_SCHEMES_SECTIONS, all_schemes_cells, lm_all_schemes_sections

    methods = {heading: {c.arm["method"] for source in sources for c in all_schemes_cells(source)}
               for heading, sources in LM_ALL_SCHEMES_SECTIONS.items()}
    assert methods == {"Without warmup": {"post_ln", "pre_ln", "deepnorm", "sigma_reparam_post_ln"},
                       "With 100 warmup updates": {"post_ln", "pre_ln", "ln_scaling", "mix_ln", "peri_ln",
                                                   "dyt", "depth_mup"}}
    for _, parts in lm_all_schemes_sections():
        for part in parts:
            assert "method" not in part.drop and "model.layers" in part.drop
