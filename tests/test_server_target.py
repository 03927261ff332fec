"""The server target against a real `transformers serve` (tiny random Llama, tokenizer trained here,
offline, CPU): restarts over three start-time flags and batching of a per-request knob, restart phases,
`autoopt bench-serve` against the running server, kill -9 of the server mid-measurement, and no server
process left after close() or after the parent is killed.

One target for the module (one server start per restart-requiring configuration, about 8 s each on
a 2-core CPU). Skips only where transformers' serving extras are not installed (they are in the test
extras: pip install -e '.[test]')."""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from autoopt.targets.base import EvalRequest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_serving_model  # noqa: E402
from tiny_serving_model import process_alive, wait_dead  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
HAVE_SERVE = all(importlib.util.find_spec(m) for m in ("transformers", "fastapi", "uvicorn", "tokenizers"))
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not HAVE_SERVE, reason="needs transformers[serving] (the test extras)")]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_serve")
    model = tiny_serving_model.cached_build(tmp_path_factory.getbasetemp())
    space = tiny_serving_model.write_space(root / "space.yaml", model, root / "home")
    return root, space


@pytest.fixture(scope="module")
def target(tiny):
    from autoopt.targets.server.target import from_spec

    root, space = tiny
    t, _ = from_spec(f"server:{space}", run_dir=root / "run")
    yield t
    t.close()


def _running_or_cb(target):
    """The configuration the previous test left running (continuous batching on, after the restart
    test), so a test that only needs *a* server does not pay a start of its own."""
    return target.baseline() | {"continuous_batching": True}


def _request(cfg, **kw):
    return EvalRequest(config=cfg, concurrency=(1, 2), time_limit_s=kw.pop("time_limit_s", 120), **kw)


def _assert_sane(m, output_tokens=8):
    assert m.status == "ok", m.failure
    for c in ("1", "2"):
        tp = m.tok_per_s[c]
        assert 1 < tp.ci_low <= tp.median <= tp.ci_high < 1e6 and tp.n == 2
    doc = json.loads(Path(m.what_ran["bench_result"]).read_text())
    for r in doc["results"]:
        for run in r["runs"]:
            assert run["failed"] == 0 and set(run["output_lens"]) == {output_tokens}
            assert 0 < run["median_ttft_ms"] < run["median_e2el_ms"] and run["median_tpot_ms"] > 0
    return doc


def test_restarts_over_three_flags_and_a_hot_knob_without_restart(target):
    base = target.baseline()
    assert target.transition(base).restart_class == "restart"
    first = target.evaluate(_request(base))
    _assert_sane(first)
    costs = first.costs_s
    assert costs["ready"] > 0 and costs["warm"] > 0 and costs["launch"] >= 0
    assert costs["restart"] == pytest.approx(costs["launch"] + costs["ready"] + costs["warm"], abs=0.05)
    assert "--dtype float32 --attn-implementation sdpa --no-continuous-batching" in first.what_ran["server"]
    pid = target._proc.server_pid()

    hot = base | {"frequency_penalty": 0.5}
    assert target.transition(hot).restart_class == "none"
    second = target.evaluate(_request(hot))
    _assert_sane(second)
    assert second.costs_s["restart"] == 0 and target._proc.server_pid() == pid  # the same server
    assert json.loads(Path(second.what_ran["bench_result"]).read_text())["workload"]["extra_body"] == \
        {"frequency_penalty": 0.5}

    for cfg, flags in ((base | {"dtype": "bfloat16", "attn_implementation": "eager"},
                        "--dtype bfloat16 --attn-implementation eager --no-continuous-batching"),
                       (base | {"continuous_batching": True}, "--dtype float32 --attn-implementation sdpa "
                                                              "--continuous-batching")):
        t = target.transition(cfg)
        assert t.restart_class == "restart" and t.changed_knobs
        m = target.evaluate(_request(cfg))
        _assert_sane(m)
        assert flags in m.what_ran["server"] and m.costs_s["restart"] > m.costs_s["ready"] > 0
        assert not process_alive(pid) and target._proc.server_pid() != pid
        pid = target._proc.server_pid()
    assert m.what_ran["objective"] == "output_throughput"


def test_profile_asked_of_a_server_without_a_profiler_says_so(target):
    m = target.evaluate(_request(_running_or_cb(target), profile=True))
    assert m.status == "ok" and m.buckets_ms == {} and m.bucket_coverage is None
    assert m.what_ran["profile"].startswith("none: this server space has no profiler")


def test_profile_of_a_server_without_the_endpoint_is_measured_without_buckets(target):
    target.spec.profile = {"start": "/start_profile", "stop": "/stop_profile", "trace_dir": "{trial_dir}/trace",
                           "trace_dir_env": None, "requests": 2, "timeout_s": 30.0}
    try:
        m = target.evaluate(_request(_running_or_cb(target), profile=True))
    finally:
        target.spec.profile = None
    assert m.status == "ok" and m.buckets_ms == {}
    assert m.what_ran["profile"] == ("none: the server has no /start_profile endpoint (HTTP 404); "
                                     "measured without buckets")


def test_bench_serve_against_the_running_server(target, tmp_path):
    if target._proc is None or not target._proc.alive():
        target.evaluate(_request(target.baseline()))
    url, model = target._base_url, target.spec.request_model
    out = tmp_path / "result.json"
    cmd = [sys.executable, "-m", "autoopt.cli", "bench-serve", url, "--model", model, "--concurrency", "1,2",
           "--prompt-tokens", "16", "--output-tokens", "8", "--requests", "4", "--repeats", "2",
           "--slo", "ttft_ms<=60000,tpot_ms<=60000", "--save-result", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert res.returncode == 0, res.stderr
    assert "C=1" in res.stdout and "C=2" in res.stdout and "tok/s" in res.stdout and "TPOT" in res.stdout
    doc = json.loads(out.read_text())
    assert [r["max_concurrency"] for r in doc["results"]] == [1, 2]
    for r in doc["results"]:
        s = r["summary"]
        assert s["output_throughput"]["median"] > 1 and s["request_goodput"]["median"] > 0
        assert s["request_goodput"]["median"] == pytest.approx(s["request_throughput"]["median"])
        for run in r["runs"]:  # vllm bench serve's per-run fields
            assert {"duration", "completed", "total_output_tokens", "output_throughput", "p99_itl_ms",
                    "mean_e2el_ms", "ttfts", "itls", "max_concurrency"} <= set(run)
            assert run["completed"] == 4 and run["total_output_tokens"] == 32
    assert doc["fixed_length"] == {"requested": "auto", "sent": False}  # transformers rejects ignore_eos

    from autoopt.targets.server.results import read_result

    back = read_result(out)
    assert back.source == "autoopt" and back.value("output_throughput", 2) == \
        doc["results"][1]["summary"]["output_throughput"]["median"]
    bad = subprocess.run(cmd[:4] + ["http://127.0.0.1:9", "--model", "m"], capture_output=True, text=True,
                         timeout=60, cwd=REPO)
    assert bad.returncode == 2 and bad.stderr.startswith("error: http://127.0.0.1:9") \
        and bad.stderr.count("\n") == 1


def test_chat_completions_stream_counts_content_not_the_role_chunk(target):
    from autoopt.targets.server.loadgen import Workload, sweep

    if target._proc is None or not target._proc.alive():
        target.evaluate(_request(target.baseline()))
    w = Workload(model=target.spec.request_model, api="chat", prompt_tokens=24, output_tokens=6, requests=2,
                 repeats=1)
    doc = sweep(target._base_url, w, (1,), timeout_s=60, warmup=False)
    run = doc["results"][0]["runs"][0]
    assert doc["endpoint"] == "/v1/chat/completions" and run["completed"] == 2
    assert run["output_lens"] == [6, 6] and all(len(itl) == 5 for itl in run["itls"])  # 6 tokens, 5 gaps
    assert abs(sum(run["input_lens"]) / 2 - 24) <= 6  # the chat template's tokens are calibrated in


def test_launch_recipe_is_the_command_a_person_can_run(target):
    cfg = target.baseline() | {"continuous_batching": True, "frequency_penalty": 0.5}
    r = target.launch_recipe(cfg, port=8123)
    assert r["argv"][:3] == ["transformers", "serve", target.spec.model]
    assert r["argv"][-5:] == ["--dtype", "float32", "--attn-implementation", "sdpa", "--continuous-batching"]
    assert "--port 8123" in r["command_line"] and r["command_line"].startswith("HF_HOME=")
    assert r["env"]["HF_HUB_OFFLINE"] == "1" and r["config_file"] is None
    assert r["request_fields"] == {"frequency_penalty": 0.5} and r["base_url"].endswith(":8123")


def test_kill_9_of_the_server_mid_measurement_is_a_failed_trial_then_it_recovers(target):
    base = target.baseline()
    target.evaluate(_request(base))  # running, so the next evaluation measures without a restart
    pid = target._proc.server_pid()
    target.spec.workload["requests"] = 40
    target.spec.workload["output_tokens"] = 64
    killer = threading.Timer(1.0, os.kill, (pid, signal.SIGKILL))
    killer.start()
    try:
        m = target.evaluate(_request(base))
    finally:
        killer.cancel()
        target.spec.workload["requests"], target.spec.workload["output_tokens"] = 4, 8
    assert m.status == "failed" and m.failure.kind == "crash"
    assert "killed by SIGKILL" in m.failure.reason and "requests failed" in m.failure.reason
    assert m.costs_s["restart"] == 0 and m.costs_s["total"] > 0.5
    assert target.transition(base).restart_class == "restart"
    again = target.evaluate(_request(base))
    _assert_sane(again)
    assert again.costs_s["restart"] > 0


def test_no_server_left_after_close(tiny, target):
    if target._proc is None or not target._proc.alive():
        target.evaluate(_request(target.baseline()))
    pid, guard = target._proc.server_pid(), target._proc.pgid
    target.close()
    assert not process_alive(pid) and not process_alive(guard)
    assert target.transition(target.baseline()).restart_class == "restart"


def test_no_server_left_after_the_parent_is_killed(tiny):
    root, space = tiny
    script = textwrap.dedent(f"""
        import time
        from autoopt.targets.base import EvalRequest
        from autoopt.targets.server.target import from_spec
        t, _ = from_spec({str(space)!r}, run_dir={str(root / 'orphan')!r})
        m = t.evaluate(EvalRequest(config=t.baseline(), concurrency=(1,), time_limit_s=120))
        print(m.status, t._proc.server_pid(), t._proc.pgid, flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        status, pid, guard = parent.stdout.readline().split()
    finally:
        parent.kill()
        parent.wait()
    assert status == "ok"
    assert wait_dead(int(pid), 15) and wait_dead(int(guard), 15)
