"""The replay target: tables (CSV, JSON lines, Kernel Tuner caches), the simulated clock, noise,
restart/compile costs, invalid configurations, buckets, and the space built from a table."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from autoopt.errors import UserError
from autoopt.targets.base import EvalRequest
from autoopt.targets.replay.target import ReplayTarget, from_spec, replay_space
from autoopt.targets.replay.table import load_table

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "replay"
CASE = FIXTURES / "casestudy.csv"


def req(config, **kw):
    return EvalRequest(config=dict(config), concurrency=(64,), min_samples=10, **kw)


def small_table(tmp_path: Path, yaml_text: str | None = None, rows: str | None = None) -> Path:
    path = tmp_path / "grid.csv"
    path.write_text(rows or "a,b,tok_per_s,compile_s,bucket_gemm_ms,bucket_copy_ms\n"
                    "x,1,100,5,60,40\nx,2,120,5,40,40\ny,1,90,0,50,60\ny,2,,0,,\n")
    if yaml_text is not None:
        (tmp_path / "grid.restart.yaml").write_text(yaml_text)
    return path


def test_synthetic_fixtures_are_what_the_generator_makes(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_tables", FIXTURES / "make_tables.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.make_all(tmp_path)
    for name in ("casestudy.csv", "tiles.csv", "kt_gemm.json"):
        assert (tmp_path / name).read_bytes() == (FIXTURES / name).read_bytes(), name


def test_clock_is_simulated_and_charges_restart_compile_measure(tmp_path):
    path = small_table(tmp_path, "measure_s: 30\nrestart_s: {a: 100, b: 0}\nbaseline: {a: x, b: 1}\n")
    t = ReplayTarget(path)
    m = t.evaluate(req({"a": "x", "b": 1}))
    # first evaluation: a fresh start (dearest restart 100) + compile 5 (first visit) + measure 30
    assert m.ok and t.now() == pytest.approx(135.0) and m.costs_s["total"] == pytest.approx(135.0)
    assert t.transition({"a": "x", "b": 2}).known_s == pytest.approx(5.0)  # runtime switch + compile
    t.evaluate(req({"a": "x", "b": 2}))
    assert t.now() == pytest.approx(135.0 + 5 + 30)
    tr = t.transition({"a": "x", "b": 1})
    assert tr.cached and tr.known_s == 0.0 and tr.restart_class == "none"
    t.evaluate(req({"a": "x", "b": 1}))  # compiled before: costs nothing but the measurement
    assert t.now() == pytest.approx(170.0 + 30)
    tr = t.transition({"a": "y", "b": 1})
    assert tr.changed_knobs == ("a",) and tr.known_s == pytest.approx(100.0)


def test_invalid_configurations_fail_with_reasons_and_cost_a_fresh_start(tmp_path):
    path = small_table(tmp_path, "measure_s: 30\nfail_s: 7\nrestart_s: {a: 100, b: 0}\n")
    t = ReplayTarget(path)
    t.evaluate(req({"a": "x", "b": 1}))
    before = t.now()
    m = t.evaluate(req({"a": "y", "b": 2}))  # a row with no objective
    assert m.status == "failed" and "no objective" in m.failure.reason
    assert t.now() == pytest.approx(before + 100 + 7)
    assert t.transition({"a": "y", "b": 1}).restart_class == "restart"  # nothing runs now
    m = t.evaluate(req({"a": "z", "b": 1}))
    assert m.status == "failed" and m.failure.kind == "excluded" and "never appears" in m.failure.reason


def test_absent_rows_are_invalid_configurations():
    t = ReplayTarget(CASE)
    base = t.baseline()
    absent = {**base, "indexer_gemm": "fp8", "glue": "compile", "attn_block_kv": 32}
    m = t.evaluate(req(absent))
    assert m.status == "failed" and "absent" in m.failure.reason
    error_row = {**base, "indexer_gemm": "fp8", "cuda_graphs": "on", "moe_experts": "loop"}
    m = t.evaluate(req(error_row))
    assert m.status == "failed" and m.failure.kind == "compile" and "graph" in m.failure.reason


def test_noise_is_seeded_and_zero_noise_has_no_spread(tmp_path):
    def medians(seed):
        t = ReplayTarget(CASE, seed=seed)
        return [t.evaluate(req(t.baseline())).tok_per_s["64"].median for _ in range(3)]

    assert medians(1) == medians(1) and medians(1) != medians(2)
    vals = medians(1)
    assert all(abs(v / 56.95 - 1) < 0.08 for v in vals)  # 1.5% noise around the recorded 56.95
    t = ReplayTarget(small_table(tmp_path))
    tp = t.evaluate(req({"a": "x", "b": 1})).tok_per_s["64"]
    assert tp.median == tp.ci_low == tp.ci_high == pytest.approx(100.0)


def test_noise_median_scatter_matches_the_declared_sd():
    t = ReplayTarget(CASE, seed=5)
    xs = [t.evaluate(req(t.baseline())).tok_per_s["64"].median / 56.95 for _ in range(300)]
    mean = sum(xs) / len(xs)
    sd = (sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5
    assert 0.010 < sd < 0.021  # the table says 0.015


def test_buckets_come_back_and_minimised_objectives_are_reciprocal(tmp_path):
    t = ReplayTarget(small_table(tmp_path))
    m = t.evaluate(req({"a": "x", "b": 2}))
    assert m.buckets_ms == {"gemm": 40.0, "copy": 40.0}
    rows = "n,time_us\n1,50\n2,25\n"
    (tmp_path / "t.csv").write_text(rows)
    t = ReplayTarget(tmp_path / "t.csv", measure_s=1)
    assert t.table.minimize and t.table.optimum().config == {"n": 2}
    a = t.evaluate(req({"n": 1})).objective(64)
    b = t.evaluate(req({"n": 2})).objective(64)
    assert b / a == pytest.approx(2.0)  # half the time: twice the rate


def test_jsonl_and_side_car_overrides(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"tile": 16, "score": 3.0, "metric_power_w": 200}, {"tile": 32, "score": 4.0, "metric_power_w": 210}]))
    (tmp_path / "rows.restart.yaml").write_text("objective: score\ndirection: maximize\nmeasure_s: 2\n")
    t = ReplayTarget(path)
    assert [s.name for s in t.knob_specs()] == ["tile"]  # metric_ columns are not knobs
    assert t.evaluate(req({"tile": "32"})).objective(64) == pytest.approx(4.0)  # "32" names 32


def test_kernel_tuner_cache_files_are_read_directly(tmp_path):
    t = ReplayTarget(FIXTURES / "kt_gemm.json", measure_s=1.0)
    assert [s.name for s in t.knob_specs()] == ["block_size_x", "block_size_y", "tile_size_x"]
    assert t.table.minimize and t.table.objective == "time"
    m = t.evaluate(req({"block_size_x": 16, "block_size_y": 1, "tile_size_x": 4}))
    assert m.failure.kind == "compile" and m.failure.reason == "CompilationFailedConfig"
    m = t.evaluate(req({"block_size_x": 128, "block_size_y": 8, "tile_size_x": 1}))
    assert m.failure.kind == "excluded"
    # Kernel Tuner leaves its cache open while tuning: no closing braces
    text = (FIXTURES / "kt_gemm.json").read_text()
    doc = json.loads(text)
    cache_txt = json.dumps({"tune_params_keys": doc["tune_params_keys"]})[:-1] + ', "cache": {' + \
        ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in list(doc["cache"].items())[:5]) + ","
    (tmp_path / "open.json").write_text(cache_txt)
    assert len(load_table(tmp_path / "open.json").rows) == 5


def test_unusable_tables_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_table(tmp_path / "nope.csv")
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(UserError, match="objective"):
        load_table(tmp_path / "x.csv")
    (tmp_path / "y.csv").write_text("a,tok_per_s\n1,\n")
    with pytest.raises(UserError, match="no valid row"):
        load_table(tmp_path / "y.csv")


def test_spec_and_space_from_a_table():
    t = from_spec(f"replay:{CASE}")
    space = replay_space(t)
    assert [p.name for p in space.params] == [s.name for s in t.knob_specs()]
    assert space.baseline_params() == t.baseline()
    knobs = {k.name: k for k in space.knobs}
    assert knobs["attention"].prior_speedup == {"mma": 2.0}  # the side-car's priors
    assert knobs["cuda_graphs"].restart_class == "restart" and knobs["cuda_graphs"].prior_apply_cost_s == 300
    cfg = space.params_to_config({**space.baseline_params(), "attention": "mma"})
    assert t.evaluate(req(cfg)).ok


def test_random_configurations_never_raise():
    t = ReplayTarget(FIXTURES / "tiles.csv", seed=0)
    rng = random.Random(0)
    specs = t.knob_specs()
    for _ in range(200):
        cfg = {s.name: rng.choice(list(s.values) + ["junk"]) for s in specs if rng.random() > 0.05}
        m = t.evaluate(req(cfg))
        assert m.ok or (m.failure is not None and m.failure.reason)
        assert t.transition(cfg).known_s >= 0


def test_a_first_use_compile_is_paid_once_by_whichever_row_has_the_value_first(tmp_path):
    """first_use_s: a compile every later row with the value shares (the first torch.compile of a
    step). The recording paid it on one row; a search pays it on whichever row it visits first."""
    path = small_table(tmp_path, "measure_s: 10\nrestart_s: {a: 0, b: 0}\nbaseline: {a: x, b: 1}\n"
                                 "first_use_s: {b: {2: 50}}\n")
    t = ReplayTarget(path)
    t.evaluate(req({"a": "x", "b": 1}))  # compile 5 + measure 10, no b=2 yet
    assert t.now() == pytest.approx(15.0)
    assert t.transition({"a": "x", "b": 2}).known_s == pytest.approx(5.0 + 50.0)
    m = t.evaluate(req({"a": "x", "b": 2}))
    assert m.costs_s["compile"] == pytest.approx(55.0)
    # another row with b=2 (failed in the table, so it costs fail_s too): its first-use is paid
    tr = t.transition({"a": "y", "b": 2})
    assert tr.known_s == pytest.approx(0.0)
    other = ReplayTarget(path)  # a new run: nothing used yet
    other.evaluate(req({"a": "x", "b": 1}))
    assert other.transition({"a": "y", "b": 2}).known_s == pytest.approx(50.0)


def test_the_side_car_cuts_reach_the_replay_space(tmp_path):
    """A table recorded from a space carries its knobs' host/launch cuts, so the agent's host bucket
    reads the same declarations in replay as on the live target."""
    path = small_table(tmp_path, "measure_s: 10\nbaseline: {a: x, b: 1}\ncuts: {a: [host, launches]}\n"
                                 "buckets: {a: [gemm], b: [copy]}\n")
    space = replay_space(ReplayTarget(path))
    knob = {k.name: k for k in space.knobs}
    assert knob["a"].cuts and set(next(iter(knob["a"].cuts.values()))) == {"host", "launches"}
    assert not knob["b"].cuts and "host" in knob["a"].buckets
