"""A study whose space weighs several concurrencies (`objective: {weights: ...}`): `autoopt run` ranks
trials by the weighted geometric mean of their tok/s, so `best`, `history` and `show` must read the
same mix by default — not the heaviest concurrency alone, which can crown another trial. Real SQLite
file, real CLI entry point; trial figures from store_helpers (per-step timings)."""
from __future__ import annotations

import json
import math

import pytest
import yaml
from store_helpers import build_case_study, measurement, run_trial
from test_cli_history import cli

from autoopt.space.space import Objective
from autoopt.store import Store

STUDY = "mix"
WEIGHTS = {1: 0.5, 64: 0.5}
# (params, tok/s per C): the mix favours "c1" (C=1 x3), C=64 alone favours "c64" (+30 % there)
TRIALS = [({"variant": "base"}, {1: 10.0, 64: 100.0}),
          ({"variant": "c1"}, {1: 30.0, 64: 110.0}),
          ({"variant": "c64"}, {1: 11.0, 64: 130.0})]


def _build(store: Store) -> list:
    settings = {"objective_mix": {str(c): w for c, w in WEIGHTS.items()}, "objective_concurrency": 64,
                "concurrency": sorted(WEIGHTS)}  # what autoopt.search.session._settings records for a mix
    run_id = store.start_run(STUDY, "autoopt run --budget 10m", "mix-space", "cd" * 32, "builtin", "tiny", 1,
                             settings)
    ms = []
    for i, (params, tok) in enumerate(TRIALS):
        m = measurement(params, tok, spread=0.002)
        run_trial(store, run_id, params, m, study=STUDY, source="baseline" if i == 0 else "neighbour",
                  reason=f"trial {i}")
        ms.append(m)
    store.finish_run(run_id, "finished", "budget spent")
    return ms


@pytest.fixture
def db(tmp_path, monkeypatch):
    path = tmp_path / "mix.sqlite"
    with Store.open(str(path)) as s:
        measured = _build(s)
        build_case_study(s)  # a second study that declares one concurrency (tok_per_s@16)
    monkeypatch.setenv("AUTOOPT_DB", f"sqlite:///{path}")
    monkeypatch.setenv("COLUMNS", "200")
    return measured


def test_best_reads_the_mix_the_run_ranked_by(db, capsys, monkeypatch) -> None:
    code, out, err = cli(capsys, monkeypatch, "best", "--study", STUDY, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["trial"]["number"] == 1 and doc["objective"] == "tok_per_s@mix"
    assert doc["objective_mix"] == {"1": 0.5, "64": 0.5}
    # the figure is the run's own (space.Objective, what `autoopt run` calls the best by)
    assert doc["trial"]["objective"]["median"] == pytest.approx(Objective(WEIGHTS).value(db[1]), rel=1e-9)
    lo, hi = Objective(WEIGHTS).ci(db[1])
    assert (doc["trial"]["objective"]["ci_low"], doc["trial"]["objective"]["ci_high"]) == pytest.approx((lo, hi))
    assert doc["trial"]["speedup"]["median"] == pytest.approx(math.sqrt(3.0 * 1.1), rel=1e-6)
    code, out, err = cli(capsys, monkeypatch, "best", "--study", STUDY)
    assert code == 0, err
    assert "by tok_per_s@mix of C=1:0.5 C=64:0.5" in out and "trial 1" in out
    assert any(line.lstrip().startswith("mix") for line in out.splitlines())  # the ranked figure's row


def test_one_concurrency_is_still_asked_for_by_name(db, capsys, monkeypatch) -> None:
    code, out, err = cli(capsys, monkeypatch, "best", "--study", STUDY, "--objective", "tok_per_s@64", "--json")
    assert code == 0, err
    assert json.loads(out)["trial"]["number"] == 2
    code, out, err = cli(capsys, monkeypatch, "history", "--study", STUDY, "--sort", "objective", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["best_number"] == 1 and [t["number"] for t in doc["trials"]] == [1, 2, 0]


def test_the_mix_of_a_study_that_declared_none_is_a_clear_error(db, capsys, monkeypatch) -> None:
    code, out, err = cli(capsys, monkeypatch, "best", "--study", "dsv4-tiny", "--objective", "tok_per_s@mix")
    assert code == 2 and out == ""
    line = err.strip().splitlines()
    assert len(line) == 1 and "tok_per_s@mix" in line[0] and "declared a weighted mix" in line[0], err


def test_the_export_names_the_objective_it_was_chosen_on(db, capsys, monkeypatch, tmp_path) -> None:
    out_file = tmp_path / "best.yaml"
    code, out, err = cli(capsys, monkeypatch, "best", "--study", STUDY, "--export", str(out_file))
    assert code == 0, err
    evidence = yaml.safe_load(out_file.read_text())["evidence"]
    assert evidence["trial_number"] == 1
    assert evidence["objective"]["name"] == "tok_per_s@mix" and evidence["objective"]["mix"] == {"1": 0.5, "64": 0.5}
    assert evidence["objective"]["median"] == pytest.approx(Objective(WEIGHTS).value(db[1]), rel=1e-9)
    code, out, err = cli(capsys, monkeypatch, "best", "--study", STUDY, "--objective", "tok_per_s@64",
                         "--export", str(out_file))
    assert code == 0, err
    evidence = yaml.safe_load(out_file.read_text())["evidence"]
    assert evidence["trial_number"] == 2 and evidence["objective"]["name"] == "tok_per_s@64"
    assert evidence["objective"]["mix"] is None


def test_diff_ends_with_the_mix_row(db, capsys, monkeypatch) -> None:
    code, out, err = cli(capsys, monkeypatch, "diff", "1", "2", "--study", STUDY, "--json")
    assert code == 0, err
    rows = json.loads(out)["tok_per_s"]
    assert [r["concurrency"] for r in rows] == [1, 64, "mix"]
    assert rows[-1]["b"]["median"] == pytest.approx(Objective(WEIGHTS).value(db[2]), rel=1e-9)
    assert rows[-1]["significant"] == "slower"  # the mix falls from "c1" to "c64" though C=64 rises
    assert rows[1]["significant"] == "faster"


def test_a_real_run_on_a_mix_names_the_winner_autoopt_best_names(tmp_path):
    """End to end on the CPU: the tiny space with two concurrencies weighed as a mix. The run's summary
    says its figures are the mix, and the best it prints is the trial `autoopt best` takes (an H100
    run once printed #121 while `best` named #83: the run ranked at C=64, `best` by the mix)."""
    from cli_helpers import REPO, run_autoopt

    space = yaml.safe_load((REPO / "search_spaces" / "dsv4_tiny_cpu.yaml").read_text())
    space.update(name="tiny_mix", concurrency=[1, 4], objective={"weights": {1: 0.5, 4: 0.5}})
    path = tmp_path / "tiny_mix.yaml"
    path.write_text(yaml.safe_dump(space))
    db = tmp_path / "m.sqlite"
    out = run_autoopt("run", "--space", str(path), "--db", str(db), "--study", STUDY, "--max-trials", "6",
                      "--seed", "3", "--plain", "--no-confirm")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "each figure is the weighted geometric mean of C=1:0.5 C=4:0.5" in out.stdout, out.stdout
    best = run_autoopt("best", "--db", str(db), "--study", STUDY, "--json")
    assert best.returncode == 0, best.stderr
    doc = json.loads(best.stdout)
    assert doc["objective"] == "tok_per_s@mix"
    number = doc["trial"]["number"]
    if doc["trial"].get("baseline"):
        assert "best: the baseline" in out.stdout, out.stdout
    else:
        assert f"best #{number}:" in out.stdout, out.stdout
