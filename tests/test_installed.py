"""An installed tx reads no checkout: `pip install .` of the sources, then from another
directory `reproduce --plan` and `reproduce --report --root R` find what they need in the
package (configs, the plans' estimates), read no checkout's cards, ask no git, and write the
report where `--results` says."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(site directory, environment) of tx installed from a copy of the sources (a build
    writes build/ beside pyproject.toml), importable only from that directory."""
    pytest.importorskip("setuptools")
    tmp = tmp_path_factory.mktemp("installed")
    source, site = tmp / "source", tmp / "site"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    for name in ("tx", "configs"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation"]
    res = subprocess.run(
        [*pip, "--no-index", "-q", "--target", str(site), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    # PYTHONPATH comes before site-packages, where the checkout's editable install is found.
    return site, {**os.environ, "PYTHONPATH": str(site)}


def _tx(env, cwd, *args) -> str:
    res = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def test_the_checkout_is_not_what_runs(installed, tmp_path):
    site, env = installed
    where = "import tx.config as c; print(c.__file__, c.checkout(), c.configs_dir())"
    module, checkout, configs = _tx(env, tmp_path, "-c", where).split()
    assert module == str(site / "tx" / "config.py") and checkout == "None"
    assert configs == str(site / "tx" / "configs")


def test_an_installed_tx_plans_a_table(installed, tmp_path):
    _, env = installed
    out = _tx(env, tmp_path, "-m", "tx", "reproduce", "--table", "2", "--plan",
              "--hardware", "v5p-8", "--json")  # fmt: skip
    rows = {r["row"]: r for r in json.loads(out)["rows"]}
    assert "tx/paper/compiled.json of" in rows["base_ende"]["estimate_source"]  # package data


def test_an_installed_tx_reports_a_table_where_results_says(installed, tmp_path):
    """A row's card under --root is reported (its commit's code unknown: no git asked), the
    other rows are not run (no checkout's cards), and the report goes to ./results/."""
    site, env = installed
    card = tmp_path / "R" / "table3-mini" / "A1" / "run_card.json"
    card.parent.mkdir(parents=True)
    shutil.copy(ROOT / "results" / "cards" / "table3-mini" / "A1.json", card)
    _tx(env, tmp_path, "-m", "tx", "reproduce", "--table", "3", "--scale", "mini", "--report",
        "--root", "R")  # fmt: skip
    report = json.loads((tmp_path / "results" / "table3-mini.json").read_text())
    rows = {e["row"]: e["measured"] for e in report["rows"]}
    assert rows["A1"]["status"] == "done" and rows["A1"]["code"]["changed_since"] is None
    assert {m["status"] for r, m in rows.items() if r != "A1"} == {"not run"}
    assert (tmp_path / "results" / "table3-mini.md").exists()
    assert (tmp_path / "results" / "cards" / "table3-mini" / "A1.json").exists()
    assert not (site / "results").exists()
