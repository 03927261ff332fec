"""The file formats a replay table is read from, each optionally gzipped (`.json.gz`, `.csv.gz`):

- CSV and JSON lines: one record per configuration (autoopt's own, see autoopt.targets.replay.table);
- Kernel Tuner cache ({"tune_params_keys": [...], "cache": {"v1,v2": {..., "time": ms}}}): objective
  `time` (minimize, unit ms), `compile_time` (ms) becomes compile_s, `benchmark_time` (ms) measure_s, and string
  times ("InvalidConfig", "CompilationFailedConfig", "RuntimeFailedConfig") are failed configurations.
  A cache Kernel Tuner left open (no closing braces) is read too;
- T4 results (the auto-tuning community's output schema, `{"schema_version", "results": [{"configuration",
  "invalidity", "measurements": [{"name", "value", "unit"}], "times": {"compilation_time", ...}}]}`):
  the objective is the first of `objectives` (else `time`), its unit the measurements' `unit`; a result whose `invalidity` is not
  "correct" is a failed configuration of that kind; `times` are read as seconds.

`read_records` returns plain records (dicts with the knob columns, the objective, and the optional
columns compile_s / measure_s / error) whatever the format.
"""
from __future__ import annotations

import csv
import gzip
import hashlib
import json
from pathlib import Path
from typing import Any

from autoopt.errors import UserError

KT_FAILURES = {"InvalidConfig": "excluded", "CompilationFailedConfig": "compile",
               "RuntimeFailedConfig": "crash"}
# T4 `invalidity` -> the failure kind a replayed trial reports (a T4 error string is kept as the reason)
T4_FAILURES = {"timeout": "hang", "compile": "compile", "runtime": "crash", "correctness": "exception",
               "constraints": "excluded"}

Records = list[dict[str, Any]]


def table_stem(path: Path) -> str:
    """`grid.csv` -> `grid`, `convolution_A100.json.gz` -> `convolution_A100`."""
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    return name.rsplit(".", 1)[0] if "." in name else name


def read_records(path: Path) -> tuple[Records, list[str], dict[str, Any], str]:
    """(records, knob names the format declares or [], metadata the format implies, sha256 of the
    file's text). UserError naming the file for anything unreadable."""
    text = _read_text(path)
    sha256 = hashlib.sha256(text.encode()).hexdigest()
    kind = path.name[:-3] if path.name.endswith(".gz") else path.name
    head = text[:100_000]
    if kind.endswith(".json") and '"tune_params_keys"' in head:
        records, knobs = _kernel_tuner(path, text)
        return records, knobs, {"objective": "time", "direction": "minimize", "unit": "ms"}, sha256
    if kind.endswith(".json") and '"schema_version"' in head and '"results"' in head:
        records, knobs, objective, unit = _t4(path, text)
        return records, knobs, {"objective": objective, "direction": "minimize", "unit": unit}, sha256
    if kind.endswith((".jsonl", ".json")):
        return _json_lines(path, text), [], {}, sha256
    if kind.endswith(".csv"):
        return _csv_records(path, text), [], {}, sha256
    raise UserError(f"replay table {path}: expected .csv, .jsonl, a Kernel Tuner .json cache or a T4 "
                    f".json results file (each may be gzipped: .gz)")


def _csv_records(path: Path, text: str) -> Records:
    reader = csv.DictReader(text.splitlines())
    records = list(reader)
    for i, rec in enumerate(records):
        if None in rec or None in rec.values():  # DictReader's marks for a longer / shorter row
            n = len(rec) - (None in rec) + len(rec.get(None) or []) - sum(v is None for v in rec.values())
            raise UserError(f"replay table {path}: line {i + 2} has {n} fields, the header "
                            f"{len(reader.fieldnames or [])}")
    return records


def _read_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
        if path.name.endswith(".gz"):
            raw = gzip.decompress(raw)
        return raw.decode("utf-8")
    except (gzip.BadGzipFile, EOFError) as exc:  # BadGzipFile is an OSError: caught first
        raise UserError(f"replay table {path}: not a valid gzip file ({exc})") from None
    except OSError as exc:
        raise UserError(f"replay table {path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise UserError(f"replay table {path}: not UTF-8 text") from None


def _json_lines(path: Path, text: str) -> Records:
    records = []
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"replay table {path}:{i + 1}: not valid JSON ({exc.msg})") from None
        if not isinstance(rec, dict):
            raise UserError(f"replay table {path}:{i + 1}: expected an object per line")
        records.append(rec)
    return records


def _load_json(path: Path, text: str, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        try:  # Kernel Tuner appends entries as it goes and closes the braces at the end
            doc = json.loads(text.rstrip().rstrip(",") + "}}")
        except json.JSONDecodeError as exc:
            raise UserError(f"{what} {path} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise UserError(f"{what} {path}: expected a JSON object")
    return doc


def _kernel_tuner(path: Path, text: str) -> tuple[Records, list[str]]:
    doc = _load_json(path, text, "Kernel Tuner cache")
    keys = list(doc.get("tune_params_keys") or [])
    if not keys or not isinstance(doc.get("cache"), dict):
        raise UserError(f"Kernel Tuner cache {path} lacks tune_params_keys or cache")
    records = []
    for entry in doc["cache"].values():
        rec = {k: entry.get(k) for k in keys}
        rec["time"] = entry.get("time")
        if isinstance(entry.get("compile_time"), (int, float)):
            rec["compile_s"] = entry["compile_time"] / 1000.0
        if isinstance(entry.get("benchmark_time"), (int, float)):
            rec["measure_s"] = entry["benchmark_time"] / 1000.0
        records.append(rec)
    return records, keys


def _t4(path: Path, text: str) -> tuple[Records, list[str], str, str | None]:
    doc = _load_json(path, text, "T4 results file")
    results = doc.get("results")
    if not isinstance(results, list) or not results:
        raise UserError(f"T4 results file {path}: `results` must be a non-empty list")
    first = results[0]
    objectives = first.get("objectives") if isinstance(first, dict) else None
    objective = str(objectives[0]) if objectives else "time"
    knobs = list((first.get("configuration") or {}) if isinstance(first, dict) else {})
    if not knobs:
        raise UserError(f"T4 results file {path}: results[0] has no configuration")
    units = [m.get("unit") for r in results if isinstance(r, dict) for m in r.get("measurements") or []
             if isinstance(m, dict) and m.get("name") == objective and m.get("unit")]
    records = [_t4_record(path, i, r, knobs, objective) for i, r in enumerate(results)]
    return records, knobs, objective, str(units[0]) if units else None


def _t4_record(path: Path, i: int, result: Any, knobs: list[str], objective: str) -> dict[str, Any]:
    if not isinstance(result, dict) or not isinstance(result.get("configuration"), dict):
        raise UserError(f"T4 results file {path}: results[{i}] lacks a configuration object")
    rec: dict[str, Any] = {k: result["configuration"].get(k) for k in knobs}
    values = {m.get("name"): m.get("value") for m in result.get("measurements") or [] if isinstance(m, dict)}
    value = values.get(objective)
    rec[objective] = sum(value) / len(value) if isinstance(value, list) and value else value
    invalidity = result.get("invalidity", "correct")
    if invalidity != "correct":
        kind = T4_FAILURES.get(str(invalidity), "exception")
        rec["error"] = f"{kind}: T4 invalidity {invalidity!r}"
        rec[objective] = None
    times = result.get("times") or {}
    if isinstance(times.get("compilation_time"), (int, float)):
        rec["compile_s"] = float(times["compilation_time"])
    runtimes = times.get("runtimes")
    if isinstance(runtimes, list) and runtimes and all(isinstance(x, (int, float)) for x in runtimes):
        rec["measure_s"] = float(sum(runtimes))
    return rec
