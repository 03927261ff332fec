"""Replay tables read from every format a user has: gzipped Kernel Tuner caches (the Auto-Tuning
Association's landscapes are shipped that way), T4 results files, and the error for a damaged file."""
from __future__ import annotations

import gzip
import json

import pytest

from autoopt.errors import UserError
from autoopt.targets.replay.formats import table_stem
from autoopt.targets.replay.table import load_table


def kt_cache() -> dict:
    cache = {}
    for bx in (16, 32):
        for tile in (1, 2):
            key = f"{bx},{tile}"
            entry = {"block_size_x": bx, "tile_size_x": tile, "time": 1.0 + bx / 32 - tile / 4,
                     "times": [1.0], "compile_time": 250.0, "benchmark_time": 40.0}
            if (bx, tile) == (32, 2):
                entry["time"] = "CompilationFailedConfig"
            cache[key] = entry
    return {"device_name": "test", "tune_params_keys": ["block_size_x", "tile_size_x"],
            "tune_params": {"block_size_x": [16, 32], "tile_size_x": [1, 2]}, "objective": "time",
            "cache": cache}


def test_a_gzipped_kernel_tuner_cache_reads_like_the_plain_one(tmp_path):
    plain, packed = tmp_path / "k.json", tmp_path / "k2.json.gz"
    plain.write_text(json.dumps(kt_cache()))
    packed.write_bytes(gzip.compress(json.dumps(kt_cache()).encode()))
    a, b = load_table(plain), load_table(packed)
    assert a.knobs == b.knobs == ["block_size_x", "tile_size_x"]
    assert {k: (r.value, r.error) for k, r in a.rows.items()} == {k: (r.value, r.error) for k, r in b.rows.items()}
    assert b.minimize and b.objective == "time"
    assert b.optimum().config == {"block_size_x": 16, "tile_size_x": 2}
    failed = [r for r in b.rows.values() if r.error]
    assert [r.failure_kind for r in failed] == ["compile"]
    assert b.optimum().compile_s == pytest.approx(0.25) and b.optimum().measure_s == pytest.approx(0.04)


def t4_doc() -> dict:
    results = []
    for bx, t, invalid in ((16, 2.0, "correct"), (32, 1.5, "correct"), (64, None, "compile"),
                           (128, 3.0, "runtime")):
        results.append({"timestamp": "2025-05-01T00:00:00Z", "configuration": {"block_size_x": bx},
                        "objectives": ["time"], "invalidity": invalid, "correctness": 1,
                        "times": {"compilation_time": 0.3, "runtimes": [0.01, 0.01]},
                        "measurements": [{"name": "time", "value": t if t else "", "unit": "ms"}]})
    return {"schema_version": "1.0.0", "results": results}


def test_a_t4_results_file_is_a_table(tmp_path):
    path = tmp_path / "run_T4.json.gz"
    path.write_bytes(gzip.compress(json.dumps(t4_doc()).encode()))
    table = load_table(path)
    assert table.knobs == ["block_size_x"] and table.objective == "time" and table.minimize
    assert table.optimum().config == {"block_size_x": 32} and table.optimum().value == 1.5
    kinds = {r.config["block_size_x"]: r.failure_kind for r in table.rows.values() if r.error}
    assert kinds == {64: "compile", 128: "crash"}
    assert table.optimum().compile_s == pytest.approx(0.3) and table.optimum().measure_s == pytest.approx(0.02)


def test_the_side_car_of_a_gzipped_table_drops_both_suffixes(tmp_path):
    path = tmp_path / "conv_A100.json.gz"
    path.write_bytes(gzip.compress(json.dumps(kt_cache()).encode()))
    (tmp_path / "conv_A100.restart.yaml").write_text("restart_s: {block_size_x: 7}\n")
    assert table_stem(path) == "conv_A100"
    assert load_table(path).meta["restart_s"] == {"block_size_x": 7}


@pytest.mark.parametrize("name, data, needle", [
    ("bad.json.gz", b"not gzip at all", "not a valid gzip file"),
    ("bad.json", b"\xff\xfe\x00binary", "not UTF-8 text"),
    ("lines.jsonl", b'{"a": 1}\n{oops\n', "bad.jsonl:2"),
])
def test_a_damaged_table_is_one_clear_error(tmp_path, name, data, needle):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(UserError, match=needle.replace("bad.jsonl", "lines.jsonl")):
        load_table(path)
