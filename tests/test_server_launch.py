"""The server target's launch side without a model: how knobs become argv / environment / a config
file / request fields, the server block's errors (file:line: key), the shipped example spaces, and
process groups (stop, parent death, a command that never becomes ready, exits, or is not found)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from autoopt.errors import SpaceError, UserError
from autoopt.targets.base import EvalRequest
from autoopt.targets.server import launch, readiness
from autoopt.targets.server.launch import Render

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_serving_model import process_alive, wait_dead, write_space  # noqa: E402


def _plan(renders, config, tmp_path, **kw):
    return launch.plan(["srv", "--port", "{port}", "--model={model}"], renders, config,
                       {"host": "127.0.0.1", "port": "9", "model": "m", "trial_dir": str(tmp_path)}, **kw)


def test_flags_render_kebab_case_negated_booleans_json_dicts_and_omitted_defaults(tmp_path):
    renders = {"max_num_seqs": Render("flag", "--max-num-seqs"), "eager": Render("flag", "--eager"),
               "cb": Render("flag", "--cb"), "cfg": Render("flag", "--cfg"),
               "trust": Render("flag", "--trust", bool_style="value"),
               "attn": Render("flag", "--attn", omit=("default",)), "one": Render("flag", "--one", omit=(True,))}
    p = _plan(renders, {"max_num_seqs": 64, "eager": True, "cb": False, "cfg": {"b": 1, "a": [2]},
                        "trust": False, "attn": "default", "one": 1}, tmp_path)
    assert p.argv == ["srv", "--port", "9", "--model=m", "--max-num-seqs", "64", "--eager", "--no-cb",
                      "--cfg", '{"a":[2],"b":1}', "--trust", "false", "--one", "1"]
    assert launch.default_flag("cb_max_batch_tokens") == "--cb-max-batch-tokens"
    assert p.config is None and p.request_fields == {}


def test_env_config_file_and_request_fields(tmp_path):
    renders = {"backend": Render("env", "ATTN_BACKEND"), "graphs": Render("env", "USE_GRAPHS"),
               "block": Render("config", "cache.block_size"), "policy": Render("config", "policy"),
               "temperature": Render("request", "temperature")}
    p = _plan(renders, {"backend": "FLASH", "graphs": True, "block": 32, "policy": "lpm", "temperature": 0.5},
              tmp_path, base_env={"KEEP": "1"}, config_flag="--config", config_base={"cache": {"dtype": "auto"}})
    assert p.env == {"KEEP": "1", "ATTN_BACKEND": "FLASH", "USE_GRAPHS": "1"}
    assert p.request_fields == {"temperature": 0.5}
    assert p.argv[-2:] == ["--config", str(tmp_path / "server_config.yaml")]
    launch.write_config_file(p)
    assert yaml.safe_load(p.config_file.read_text()) == {"cache": {"dtype": "auto", "block_size": 32},
                                                         "policy": "lpm"}
    j = _plan({"block": Render("config", "block")}, {"block": 16}, tmp_path, config_format="json")
    launch.write_config_file(j)
    assert json.loads(j.config_file.read_text()) == {"block": 16}


def test_a_knob_value_never_reaches_a_shell(tmp_path):
    p = _plan({"name": Render("flag", "--name")}, {"name": "x; rm -rf / #"}, tmp_path)
    assert p.argv[-1] == "x; rm -rf / #"  # one argument, passed to exec as is
    assert "'x; rm -rf / #'" in p.command_line()


BLOCK_ERRORS = [
    ("command: \"vllm serve {model}\"", "server.command: expected an argv list"),
    ("command: [srv, \"{nope}\"]", "server.command[1]: unknown placeholder {nope}"),
    ("port: 70000", "server.port: expected auto or a port number"),
    ("colour: blue", "server.colour: unknown key"),
    ("workload: {api: grpc}", "server.workload.api: expected completions or chat"),
    ("objective_metric: speed", "server.objective_metric: expected one of output_throughput"),
    ("slo: ttft<=5", "server.slo: expected METRIC<=MS"),
    ("knobs: {dtype: {flag: dtype}}", "server.knobs.dtype.flag: expected a flag starting with -"),
    ("knobs: {dtype: {flag: --dtype, env: DTYPE}}", "server.knobs.dtype: expected exactly one of"),
]


@pytest.mark.parametrize("line,expected", BLOCK_ERRORS)
def test_server_block_errors_name_file_line_and_key(tmp_path, line, expected):
    from autoopt.targets.server.spec import read

    base = {"command": '[srv, "{port}"]', "model": "m"}
    key = line.split(":")[0]
    base.pop(key, None)
    body = "\n".join(f"  {k}: {v}" for k, v in base.items()) + f"\n  {line}\n"
    p = tmp_path / "bad.yaml"
    p.write_text(f"name: bad\ntarget: server\nserver:\n{body}knobs:\n  dtype: {{values: [a, b]}}\n")
    with pytest.raises(SpaceError) as exc:
        read(p)
    msg = str(exc.value)
    assert expected in msg and msg.startswith(str(p)) and ":" in msg.split(str(p))[1][:4]


def test_a_flag_knob_cannot_claim_no_restart(tmp_path):
    from autoopt.targets.server.spec import read

    p = tmp_path / "s.yaml"
    p.write_text("target: server\nserver: {command: [srv], model: m}\nknobs:\n"
                 "  dtype: {values: [a, b], restart_class: none}\n")
    with pytest.raises(SpaceError, match=r"s.yaml:4: knobs.dtype.restart_class: expected restart"):
        read(p)


@pytest.mark.parametrize("name", ["server_transformers", "server_vllm", "server_sglang"])
def test_shipped_server_spaces_validate_and_are_packaged(name):
    from autoopt.targets.server.searchspace import server_space
    from autoopt.targets.server.spec import read
    from autoopt.targets.server.target import ServerTarget

    src = REPO / "search_spaces" / f"{name}.yaml"
    assert (REPO / "autoopt" / "data" / f"{name}.yaml").read_bytes() == src.read_bytes()
    t = ServerTarget(read(src))
    try:
        space = server_space(t)
        hot = [k for k, r in t.spec.renders.items() if r.hot]
        assert len(hot) == 1 and t.spec.restart_classes[hot[0]] == "none"
        assert sum(t.spec.restart_classes[k] == "restart" for k in t.spec.values) >= 5
        assert len(space.params) == len(t.spec.values) and space.constraints
    finally:
        t.close()


# ---- processes ---------------------------------------------------------------------------------
CHILD_SPAWNER = textwrap.dedent("""
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("grandchild", child.pid, flush=True)
    time.sleep(600)
""")


def _grandchild(log: Path, timeout_s: float = 20.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if line.startswith("grandchild"):
                return int(line.split()[1])
        time.sleep(0.1)
    raise AssertionError(f"no grandchild in {log}: {log.read_text()}")


def test_stop_ends_the_whole_process_group(tmp_path):
    proc = launch.ServerProcess(launch.LaunchPlan([sys.executable, "-c", CHILD_SPAWNER]), tmp_path / "s.log")
    grandchild = _grandchild(tmp_path / "s.log")
    server = proc.server_pid()
    assert server and process_alive(server) and os.getpgid(grandchild) == proc.pgid
    took_s = proc.stop(grace_s=5)
    assert not process_alive(server) and wait_dead(grandchild, 2) and took_s < 5
    assert "killed by SIGTERM" in proc.exit_description()


def test_no_server_outlives_a_killed_parent(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from autoopt.targets.server import launch
        p = launch.ServerProcess(launch.LaunchPlan([sys.executable, "-c", {CHILD_SPAWNER!r}]),
                                 Path({str(tmp_path / 's.log')!r}))
        print(p.proc.pid, flush=True)
        time.sleep(600)
    """))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    guard = int(parent.stdout.readline())
    grandchild = _grandchild(tmp_path / "s.log")
    server = int((tmp_path / "s.pid").read_text())
    parent.kill()  # SIGKILL: no cleanup code of autoopt runs
    parent.wait()
    assert wait_dead(server, 5) and wait_dead(grandchild, 15) and wait_dead(guard, 15)


def test_readiness_fails_fast_with_the_log_tail_when_the_process_exits(tmp_path):
    cmd = [sys.executable, "-c", "import sys; print('boom: no such model', flush=True); sys.exit(3)"]
    proc = launch.ServerProcess(launch.LaunchPlan(cmd), tmp_path / "s.log")
    start = time.monotonic()
    with pytest.raises(readiness.NotReady) as exc:
        readiness.wait_ready(f"http://127.0.0.1:{launch.free_port()}", proc, timeout_s=60)
    assert time.monotonic() - start < 10
    assert exc.value.kind == "crash" and "exited with status 3" in exc.value.reason
    assert "boom: no such model" in exc.value.log_tail


def _space(tmp_path: Path, command: str, port: str = "auto", ready_timeout_s: float = 3) -> Path:
    return write_space(tmp_path / "space.yaml", tmp_path / "model", tmp_path / "home", command=command,
                       port=port, ready_timeout_s=ready_timeout_s)


def test_a_server_that_never_becomes_ready_is_a_failed_hang(tmp_path):
    from autoopt.targets.server.target import from_spec

    sleeper = f'[{sys.executable}, -c, "import time; time.sleep(600)"]'  # takes the flags, never listens
    target, _ = from_spec(_space(tmp_path, sleeper), run_dir=tmp_path / "run")
    try:
        m = target.evaluate(EvalRequest(config=target.baseline(), concurrency=(1,)))
        assert m.status == "failed" and m.failure.kind == "hang"
        assert "not ready after 3 s" in m.failure.reason and m.costs_s["ready"] >= 3
        pid = int((tmp_path / "run" / "trial_0001" / "server.pid").read_text())
    finally:
        target.close()
    assert not process_alive(pid)


def test_a_missing_command_is_a_user_error_before_anything_runs(tmp_path):
    from autoopt.targets.server.target import from_spec

    with pytest.raises(UserError, match=r"server.command\[0\]: 'no-such-server-xyz' is not found on PATH"):
        from_spec(_space(tmp_path, "[no-such-server-xyz, serve]"))


def test_a_command_gone_after_the_start_check_is_a_failed_trial(tmp_path):
    from autoopt.targets.server.target import from_spec

    target, _ = from_spec(_space(tmp_path, "[sleep]"), run_dir=tmp_path / "run")
    target.spec.command = ["no-such-server-xyz"]
    try:
        m = target.evaluate(EvalRequest(config=target.baseline(), concurrency=(1,)))
    finally:
        target.close()
    assert m.status == "failed" and m.failure.kind == "crash"
    assert "command not found: no-such-server-xyz" in m.failure.reason


def test_a_port_in_use_is_a_user_error_or_a_failed_trial(tmp_path):
    from autoopt.targets.server.target import from_spec

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(UserError, match=f"server.port: port {port} on 127.0.0.1 is in use"):
            from_spec(_space(tmp_path, '[sleep, "600"]', port=str(port)))
        free = launch.free_port()
        target, _ = from_spec(_space(tmp_path, '[sleep, "600"]', port=str(free)), run_dir=tmp_path / "run")
        target.spec.port = port  # taken after the check: the trial fails, nothing starts
        m = target.evaluate(EvalRequest(config=target.baseline(), concurrency=(1,)))
        target.close()
    assert m.status == "failed" and f"port {port} on 127.0.0.1 is in use" in m.failure.reason
    assert not (tmp_path / "run" / "trial_0001" / "server.log").exists()


def test_unknown_knobs_and_values_are_failed_measurements(tmp_path):
    from autoopt.targets.server.target import from_spec

    target, specs = from_spec(_space(tmp_path, "[sleep]"), run_dir=tmp_path / "run")
    base = target.baseline()
    try:
        for cfg, words in ((base | {"colour": 1}, "not knobs"), (base | {"dtype": "int3"}, "not one of"),
                           ({k: v for k, v in base.items() if k != "dtype"}, "missing")):
            m = target.evaluate(EvalRequest(config=cfg, concurrency=(1,)))
            assert m.status == "failed" and m.failure.kind == "excluded" and words in m.failure.reason
    finally:
        target.close()
    assert {s.name: s.restart_class for s in specs} == {"dtype": "restart", "attn_implementation": "restart",
                                                        "continuous_batching": "restart",
                                                        "frequency_penalty": "none"}


def test_the_newest_trace_a_server_writes_is_found_and_bucketed(tmp_path):
    import shutil
    import threading

    from autoopt.profile.trace import profile_trace
    from autoopt.targets.server import profiler

    traces = tmp_path / "trace"
    traces.mkdir()
    shutil.copy(REPO / "tests" / "fixtures" / "traces" / "cpu_mhc_fp32.json.gz", traces / "old.pt.trace.json.gz")
    before = profiler.trace_files(traces)
    src = REPO / "tests" / "fixtures" / "traces" / "cpu_mhc_bf16_cast.json.gz"
    writer = threading.Timer(0.3, shutil.copy, (src, traces / "rank0.pt.trace.json.gz"))
    writer.start()  # as a server does after /stop_profile: a new file, a moment later
    found = profiler.wait_for_new_trace(traces, before, timeout_s=20)
    assert found.name == "rank0.pt.trace.json.gz"
    assert profile_trace(found).buckets_ms == profile_trace(src).buckets_ms
    with pytest.raises(profiler.ProfileUnavailable, match="no trace appeared"):
        profiler.wait_for_new_trace(traces, profiler.trace_files(traces), timeout_s=1)
