"""The H200 decode table (benchmarks/data/h200_flash_decode.*): its design, the merge of its two
passes, and that the committed table is the whole design as a replay target reads it."""
from __future__ import annotations

import csv
import math
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import merge_decode_passes as merge_mod  # noqa: E402
import record_decode_table as rec  # noqa: E402

from autoopt.targets.replay.target import ReplayTarget, replay_space  # noqa: E402

TABLE = ROOT / "benchmarks" / "data" / "h200_flash_decode.csv"


def test_the_design_has_150_rows_or_more_each_allowed_and_the_dear_ones_last():
    rows = rec.design()
    assert len(rows) >= 150
    assert all(rec.allowed(r) for r in rows)
    assert rows[0] == {k: v[0] for k, v in rec.LEVELS.items()}  # the baseline first
    compiled = [i for i, r in enumerate(rows) if r["step_compile"] != "off"]
    assert compiled == list(range(len(rows) - len(compiled), len(rows)))  # step_compile rows last
    steps = [sum(a[k] != b[k] for k in rec.LEVELS) for a, b in zip(rows, rows[1:])]
    assert statistics.median(steps) == 1  # a person's order: one knob at a time, mostly


def test_the_committed_table_is_the_whole_design_and_loads_as_a_replay_target():
    target = ReplayTarget(TABLE)
    keys = {rec.key_of(r) for r in rec.design()}
    assert {tuple(k) for k in target.table.rows} == keys
    assert target.table.meta["first_use_s"]["step_compile"]["inductor"] > 60  # two Inductor compiles
    assert target.table.meta["machine"]["gpu_capability"] == "9.0"
    space = replay_space(target)
    cuts = {k.name: k.cuts for k in space.knobs}
    assert cuts["cuda_graphs"] and not cuts["attention"]  # the space file's declarations


def _recording(tmp_path: Path, name: str, values: dict[tuple, float | str]) -> Path:
    path = tmp_path / name
    cols = list(rec.LEVELS) + ["tok_per_s_mix", "noise", "error", "measure_s", "metric_guard",
                               "metric_guard_s", "compile_s"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for i, (cfg, v) in enumerate(values.items()):
            row = dict(zip(rec.LEVELS, cfg))
            failed = isinstance(v, str)
            row.update(tok_per_s_mix="" if failed else v, noise="" if failed else 0.01,
                       error=v if failed else "", measure_s=2.0, metric_guard="ok 0" if i % 2 == 0 else "",
                       metric_guard_s=0.5, compile_s=1.0)
            w.writerow(row)
    return path


def _configs(n: int, graphs: str) -> list[tuple]:
    base = [v[0] for v in rec.LEVELS.values()]
    base[0] = graphs
    return [tuple(base[:-1] + [f"v{i}"]) for i in range(n)]


def test_the_merged_noise_is_the_scatter_between_processes_not_within_one(tmp_path):
    on, off = _configs(3, "on"), _configs(3, "off")
    first = _recording(tmp_path, "a.csv", {**{c: 100.0 for c in on}, **{c: 10.0 for c in off}})
    second = _recording(tmp_path, "b.csv", {**{c: 110.0 for c in on}, **{c: 20.0 for c in off}})
    rows, between = merge_mod.merge(rec.read_done(first), rec.read_done(second))
    assert between["cuda_graphs=on"] == pytest.approx(math.log(1.1) / math.sqrt(2), abs=1e-4)
    assert between["cuda_graphs=off"] == pytest.approx(math.log(2.0) / math.sqrt(2), abs=1e-4)
    on_row = next(r for r in rows if r["cuda_graphs"] == "on")
    assert float(on_row["tok_per_s_mix"]) == pytest.approx(math.sqrt(100 * 110), rel=1e-4)
    assert float(on_row["noise"]) == pytest.approx(math.hypot(0.01, math.log(1.1) / math.sqrt(2)), abs=1e-4)


def test_a_row_failed_in_either_pass_stays_failed_and_different_rows_are_refused(tmp_path):
    on = _configs(2, "on")
    first = _recording(tmp_path, "a.csv", {on[0]: 100.0, on[1]: 90.0})
    second = _recording(tmp_path, "b.csv", {on[0]: 100.0, on[1]: "exception: guard verdict wrong"})
    rows, _ = merge_mod.merge(rec.read_done(first), rec.read_done(second))
    assert rows[1]["tok_per_s_mix"] == "" and rows[1]["error"].startswith("second pass: exception")
    third = _recording(tmp_path, "c.csv", {on[0]: 100.0})
    with pytest.raises(SystemExit, match="different rows"):
        merge_mod.merge(rec.read_done(first), rec.read_done(third))


def test_the_first_use_compile_moves_out_of_the_row_that_paid_it():
    rows = [{"step_compile": "inductor", "compile_s": "71.0", "measure_s": "46.0", "metric_guard_s": "45.0",
             "metric_guard": "ok"},
            {"step_compile": "inductor", "compile_s": "1.0", "measure_s": "2.0", "metric_guard_s": "1.0",
             "metric_guard": "ok"},
            {"step_compile": "off", "compile_s": "0.5", "measure_s": "2.0", "metric_guard_s": "0.0",
             "metric_guard": ""}]
    cold = merge_mod.split_first_use(rows, "step_compile", "inductor")
    assert cold == pytest.approx((71 - 1) + (45 - 1))
    assert rows[0]["compile_s"] == 1.0 and rows[0]["measure_s"] == pytest.approx(2.0)
    assert rows[2]["compile_s"] == "0.5"  # rows without the value are untouched
