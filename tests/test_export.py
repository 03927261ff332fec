"""The pure parts: objective parsing, speed-up intervals, the best-trial rule, and the export document."""
from __future__ import annotations

import sys
from datetime import datetime

import pytest
import yaml
from store_helpers import ENV, measurement

from autoopt.errors import UserError
from autoopt.export import build_export, expand_layers, split_config, write_export
from autoopt.results import Measurement, Throughput
from autoopt.store import RunRecord, TrialRecord
from autoopt.store import analysis as an

T0 = datetime(2025, 1, 1, 12, 0, 0)


def record(number: int, tok: dict[int, float], *, state: str = "ok", spread: float = 0.01,
           config: dict | None = None, baseline: bool = False) -> TrialRecord:
    params = {"mhc_gemm": "bf16" if number else "fp32"}
    m = measurement(params, tok, spread=spread, status="wrong" if state == "wrong" else "ok")
    if state == "failed":
        m = Measurement.failed(params, "crash", "segfault in the worker")
    return TrialRecord(study="s", number=number, trial_id=100 + number, state=state, params=params,
                       config=config or dict(params), measurement=m, objective=None, objective_ci=None,
                       decision={"source": "baseline" if baseline else "sampler:tpe"}, extra={},
                       started_at=T0, finished_at=T0, run_id=1, objective_name="tok_per_s@16",
                       is_baseline=baseline)


RUN = RunRecord(id=1, study="s", state="finished", stop_reason="budget spent", command_line="autoopt run",
                space_name="dsv4-gemm", space_sha256="cd" * 32, target="builtin", preset="flash-slice",
                seed=1, settings={"objective": "tok_per_s@16", "n_layers": 3}, host="h", pid=1,
                autoopt_version="0.1.0", started_at=T0, finished_at=T0)


# ---- analysis ---------------------------------------------------------------------------------------
def test_parse_and_resolve_objective():
    assert an.parse_objective("tok_per_s@16") == ("tok_per_s", 16)
    assert an.parse_objective("tok_per_s") == ("tok_per_s", None)
    with pytest.raises(UserError, match="tok_per_s@<concurrency>"):
        an.parse_objective("tokens@16")
    trials = [record(0, {1: 30.0, 16: 60.0}, baseline=True)]
    assert an.resolve_objective("tok_per_s@1", trials, [RUN]) == 1
    assert an.resolve_objective(None, trials, [RUN]) == 16  # the run's settings
    mix = RunRecord(**{**RUN.__dict__, "settings": {"objective_concurrency": 64}})
    assert an.resolve_objective(None, trials, [mix]) == 64
    trials[0].objective_name = None
    with pytest.raises(UserError, match=r"measured: 1, 16\): pass --objective"):
        an.resolve_objective(None, trials, [])


def test_speedup_interval_is_the_conservative_ratio():
    t = Throughput(median=70.0, ci_low=69.0, ci_high=71.0, n=16)
    b = Throughput(median=62.0, ci_low=61.5, ci_high=62.5, n=16)
    assert an.speedup(t, b) == {"median": 70 / 62, "ci_low": 69 / 62.5, "ci_high": 71 / 61.5}
    assert an.significant(t, b) and not an.significant(b, t)
    touching = Throughput(median=63.0, ci_low=62.5, ci_high=63.5, n=16)
    assert not an.significant(touching, b)  # low end == baseline high end: inside the noise


def test_select_best_needs_a_gain_outside_the_noise():
    base = record(0, {16: 62.0}, baseline=True)
    noisy = record(1, {16: 66.0}, spread=0.2)  # higher median, CI overlaps the baseline's
    solid = record(2, {16: 64.0})
    wrong = record(3, {16: 90.0}, state="wrong")
    choice = an.select_best([base, noisy, solid, wrong], base, 16)
    assert (choice.trial.number, choice.significant, choice.candidates, choice.significant_count) == (2, True, 2, 1)
    flat = an.select_best([base, noisy], base, 16)
    assert flat.trial is base and not flat.significant
    with pytest.raises(UserError, match="no successful baseline"):
        an.select_best([noisy, solid], None, 16)


def test_knob_and_bucket_diffs():
    assert an.knob_diff({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4}) == [
        {"name": "b", "a": 2, "b": 3}, {"name": "c", "a": None, "b": 4}]
    rows = an.bucket_diff({"gemm_simt": 1004.0, "copy_cast": 190.0}, {"gemm_tensorop": 499.0, "copy_cast": 500.0})
    assert [r["bucket"] for r in rows] == ["gemm_simt", "gemm_tensorop", "copy_cast"]
    assert rows[2]["delta_ms"] == 310.0 and rows[2]["delta_pct"] == pytest.approx(310 / 190 * 100)
    assert rows[1]["delta_pct"] is None


# ---- export document --------------------------------------------------------------------------------
def test_split_and_expand_layer_overrides():
    cfg = {"mhc_gemm": "bf16", "mhc_operand": "cast", "layer_overrides": [[1, "mhc_operand", "view"]]}
    knobs, over = split_config(cfg)
    assert knobs == {"mhc_gemm": "bf16", "mhc_operand": "cast"} and over == {1: {"mhc_operand": "view"}}
    assert split_config({"k": 1, "layer_overrides": {"2": {"k": 3}}})[1] == {2: {"k": 3}}
    assert expand_layers(knobs, over, 3, ()) == {0: {"mhc_operand": "cast"}, 1: {"mhc_operand": "view"},
                                                 2: {"mhc_operand": "cast"}}
    assert expand_layers(knobs, over, None, ()) == {1: {"mhc_operand": "view"}}
    assert expand_layers(knobs, {}, 3, ()) == {}
    with pytest.raises(UserError, match="outside 0..2"):
        expand_layers(knobs, {5: {"mhc_operand": "view"}}, 3, ())
    with pytest.raises(UserError, match=r"expected \[layer, knob, value\]"):
        split_config({"layer_overrides": [[1, "k"]]})


def test_build_export_document():
    base = record(0, {1: 33.0, 16: 62.0}, baseline=True)
    cfg = {"mhc_gemm": "bf16", "layer_overrides": [[2, "mhc_operand", "view_bf16_residual"]]}
    best = record(2, {1: 35.0, 16: 69.5}, config=cfg)
    doc = build_export(best, base, RUN)
    assert list(doc) == ["autoopt_export", "target", "preset", "knobs", "layers", "space", "environment",
                         "evidence", "autoopt_version"]
    assert (doc["autoopt_export"], doc["target"], doc["preset"]) == (1, "builtin", "flash-slice")
    assert doc["knobs"] == {"mhc_gemm": "bf16"}
    assert doc["layers"] == {0: {}, 1: {}, 2: {"mhc_operand": "view_bf16_residual"}}
    assert doc["space"] == {"name": "dsv4-gemm", "sha256": "cd" * 32} and doc["environment"] == ENV
    ev = doc["evidence"]
    t16, b16 = best.measurement.tok_per_s["16"], base.measurement.tok_per_s["16"]
    assert ev["tok_per_s"][16] == {"median": t16.median, "ci_low": t16.ci_low, "ci_high": t16.ci_high}
    assert ev["speedup"][16] == {"median": t16.median / b16.median, "ci_low": t16.ci_low / b16.ci_high,
                                 "ci_high": t16.ci_high / b16.ci_low}
    assert (ev["study"], ev["trial_number"], ev["trial_id"]) == ("s", 2, 102)
    assert ev["correctness"]["verdict"] == "ok"
    assert build_export(best, None, None)["evidence"]["speedup"] == {}


@pytest.mark.parametrize("state, needle", [("failed", r"is failed \(crash: segfault"), ("wrong", "is wrong")])
def test_build_export_refuses_unsuccessful_trials(state, needle):
    with pytest.raises(UserError, match=needle):
        build_export(record(3, {16: 80.0}, state=state), None, RUN)


def test_write_export_roundtrip_and_fallback(tmp_path, monkeypatch):
    doc = build_export(record(2, {16: 69.5}), record(0, {16: 62.0}, baseline=True), RUN)
    path = tmp_path / "config.yaml"
    write_export(path, doc)
    assert yaml.safe_load(path.read_text()) == doc
    monkeypatch.setitem(sys.modules, "autoopt.config_file", None)  # owner's writer missing
    assert write_export(tmp_path / "fallback.yaml", doc) == "yaml"
    assert yaml.safe_load((tmp_path / "fallback.yaml").read_text()) == doc
    with pytest.raises(UserError, match="does not exist"):
        write_export(tmp_path / "no" / "dir.yaml", doc)
