"""Studies built by real `autoopt run` subprocesses on a Kernel Tuner table (objective `time` in ms,
minimised), read back by the reading commands:
- a continued study (two runs, each measuring its own baseline, noise 5 %): history, show, diff,
  browse and report give every trial its speed-up over its own run's baseline (analysis.baseline_before,
  the function `autoopt best` uses), never over a baseline measured in an earlier run;
- the same table without noise: every reading command states the objective as `time` in ms, lower is
  better, and shows each trial's time as recorded in the table (not its reciprocal as tok/s)."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_browse_app import screen_text

from autoopt.cli.browse.app import BrowseApp
from autoopt.cli.browse.data import StudySource
from autoopt.store.reading import open_for_reading

ROOT = Path(__file__).resolve().parents[1]
KT_TABLE = ROOT / "tests" / "fixtures" / "replay" / "kt_gemm.json"
STUDY = "kt"


def autoopt(*args: str, columns: int = 200) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "AUTOOPT_DB"}
    return subprocess.run([sys.executable, "-m", "autoopt.cli", *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env={**env, "COLUMNS": str(columns)})


def build(tmp: Path, noise: float | None, seeds: tuple[int, ...]) -> Path:
    table = tmp / "kt_gemm.json"
    shutil.copy(KT_TABLE, table)
    if noise is not None:
        (tmp / "kt_gemm.restart.yaml").write_text(f"noise: {noise}\n")
    db = tmp / "kt.sqlite"
    for seed in seeds:  # a second run continues the study: it measures a baseline of its own
        out = autoopt("run", "--target", f"replay:{table}", "--strategy", "random", "--max-trials", "6",
                      "--budget", "1000h", "--study", STUDY, "--db", str(db), "--plain", "--no-confirm",
                      "--seed", str(seed))
        assert out.returncode == 0, out.stderr
    return db


def as_json(*args: str) -> dict:
    out = autoopt(*args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def continued(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("continued"), noise=0.05, seeds=(1, 2))


@pytest.fixture(scope="module")
def exact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("exact"), noise=None, seeds=(3,))


def own_baseline(number: int, baselines: list[int]) -> int:
    return max(b for b in baselines if b <= number)


def test_every_trial_is_compared_with_its_own_runs_baseline(continued: Path) -> None:
    doc = as_json("history", "--db", str(continued))
    rows = {r["number"]: r for r in doc["trials"]}
    baselines = doc["baselines"]
    assert len(baselines) == 2 and doc["baseline_number"] == baselines[-1]
    first, second = (rows[b]["objective"]["median"] for b in baselines)
    assert first != second  # two measurements of one configuration: the test tells them apart
    later = [r for r in rows.values() if r["number"] > baselines[1] and r["objective"]]
    assert later, "the second run measured nothing"
    for r in rows.values():
        if not r["objective"]:
            continue
        base = own_baseline(r["number"], baselines)
        assert r["baseline_of"] == base and r["run_id"] == rows[base]["run_id"]
        assert r["speedup"]["median"] == pytest.approx(r["objective"]["median"] / rows[base]["objective"]["median"])
    for r in later:  # what the old code did: everything against the first baseline
        assert r["speedup"]["median"] != pytest.approx(r["objective"]["median"] / first)
    # show and diff read the same baseline; the history marks the trial `best` takes
    n = later[-1]["number"]
    show = as_json("show", str(n), "--db", str(continued))
    assert show["baseline_number"] == baselines[1] and show["trial"]["speedup"] == rows[n]["speedup"]
    diff = as_json("diff", str(baselines[0]), str(n), "--db", str(continued))
    assert diff["b"]["speedup"] == rows[n]["speedup"] and diff["a"]["baseline_of"] == baselines[0]
    best = as_json("best", "--db", str(continued))
    assert (doc["best_number"], doc["best_significant"]) == (best["trial"]["number"], best["significant"])
    assert best["trial"]["speedup"] == rows[best["trial"]["number"]]["speedup"]
    with open_for_reading(str(continued)) as store:  # the browser's rows are the history's rows
        source = StudySource(store, STUDY)
        assert {k: {**v} for k, v in source.rows.items()} == rows
        assert source.best_number() == best["trial"]["number"]
        assert source.detail(n)["speedup"] == rows[n]["speedup"]


def test_every_reading_command_states_the_unit_and_direction(exact: Path, tmp_path: Path) -> None:
    table = json.loads(KT_TABLE.read_text())["cache"]
    recorded_ms = {tuple(v[k] for k in ("block_size_x", "block_size_y", "tile_size_x")): v["time"]
                   for v in table.values() if isinstance(v.get("time"), (int, float))}
    doc = as_json("history", "--db", str(exact))
    assert {k: doc["objective_unit"][k] for k in ("quantity", "unit", "direction")} == \
        {"quantity": "time", "unit": "ms", "direction": "minimize"}
    ok = [r for r in doc["trials"] if r["objective"]]
    assert len(ok) >= 3
    for r in ok:  # the table's own figure, in ms, where tok/s would read 0.2
        p = r["params"]
        assert r["objective_value"]["median"] == pytest.approx(
            recorded_ms[(p["block_size_x"], p["block_size_y"], p["tile_size_x"])])
        assert r["objective_value"]["median"] == pytest.approx(1 / r["objective"]["median"])
    fastest = min(ok, key=lambda r: r["objective_value"]["median"])
    shown = f"{fastest['objective_value']['median']:.4g}"
    for args in (["history"], ["show", str(fastest["number"])], ["diff", "0", str(fastest["number"])], ["best"]):
        out = autoopt(*args, "--db", str(exact))
        assert out.returncode == 0, (args, out.stderr)
        assert "time in ms, lower is better" in out.stdout and "time ms" in out.stdout, (args, out.stdout)
        assert shown in out.stdout and "tok/s" not in out.stdout, (args, out.stdout)
    out = autoopt("report", "--db", str(exact), "--out", str(tmp_path / "kt.html"))
    assert out.returncode == 0, out.stderr
    html = (tmp_path / "kt.html").read_text()
    assert "time in ms, lower is better" in html and "time ms [95% CI]" in html and shown in html

    async def browse() -> str:
        with open_for_reading(str(exact)) as store:
            app = BrowseApp(store, STUDY)
            async with app.run_test(size=(120, 40)) as pilot:
                await pilot.pause()
                await pilot.press("b")  # the cursor on the best trial: its detail in the pane
                await pilot.pause()
                return screen_text(app)

    text = asyncio.run(browse())
    assert "time in ms, lower is better" in text and "time ms [95% CI]" in text, text
    assert shown in text and "tok/s" not in text, text
