"""`deepinit --help`: the verbs and every config group with its options."""
from __future__ import annotations

from tests.conftest import REPO, run_cli_here


def test_help_lists_every_config_group_with_its_options(tmp_path):
    """The groups are listed through one copy of Hydra's config repository
    (runner.cli.train.one_repository_for_group_listing), not one per query: the lines are what
    conf/ and the ConfigStore hold, and Hydra's own method is back in place afterwards."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    from runner.init import SCHEMES
    from runner.model.sublayer import PLACEMENT_OPTIONS

    before = ConfigLoaderImpl.get_group_options
    proc = run_cli_here(["--help"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert ConfigLoaderImpl.get_group_options is before
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines()
                 if ": " in line and line.split(": ", 1)[0].isidentifier())
    expected = {group.name: ", ".join(sorted(p.stem for p in group.glob("*.yaml")))
                for group in (REPO / "conf").iterdir() if group.is_dir() and group.name != "hydra"}
    expected["init_options"] = ", ".join(sorted(SCHEMES))
    expected["norm_options"] = ", ".join(sorted(PLACEMENT_OPTIONS))
    assert {g: lines.get(g) for g in expected} == expected
    assert "deepinit train [KEY=VALUE ...]" in proc.stdout
