"""`autoopt run` tunes a real `transformers serve` (issue 11's done-when), in subprocesses as a user runs it.

The tiny random Llama (tests/tiny_serving_model.py, offline, CPU) is tuned by `autoopt run --strategy
random` for 9 trials over three restart-requiring flags (--dtype, --attn-implementation,
--enable-cors) and one per-request field (frequency_penalty). While it runs, a watcher kills the
server of the fourth trial with SIGKILL: that trial is failed with its reason and the run goes on.
Then the reading commands (history, show, diff, best --export) on the study, and the start failures
(a taken port, a server that never becomes ready, a command that is not found), each against the
same database, which keeps every trial it had.

--enable-cors stands in for --continuous-batching as the third flag: on this 2-core CPU a
continuous-batching server's warm-up alone takes 10-30 s, which would put the test over 3 minutes;
test_server_target.py covers that flag's restart.
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_serving_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
HAVE_SERVE = all(importlib.util.find_spec(m) for m in ("transformers", "fastapi", "uvicorn", "tokenizers"))
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not HAVE_SERVE, reason="needs transformers[serving] (the test extras)")]
RESTART_FLAGS = ("dtype", "attn_implementation", "enable_cors")
KILLED_TRIAL_DIR = "trial_0004"  # the server target's fourth evaluation


def _autoopt(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autoopt.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def _space(root: Path, model: Path, name: str = "space.yaml", **kw) -> Path:
    path = tiny_serving_model.write_space(root / name, model, root / "home", output_tokens=6, requests=3,
                                          knobs=("dtype", "attn_implementation", "frequency_penalty"), **kw)
    path.write_text(path.read_text() + "  enable_cors: {values: [false, true]}\n")  # --enable-cors
    return path


def _servers(model: Path) -> list[int]:
    """pids of `transformers serve MODEL` processes (not their guards), from /proc."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = [a.decode(errors="replace") for a in argv]
        if str(model) in text and "serve" in text and not any(a.endswith("guard.py") for a in text):
            out.append(int(entry.name))
    return [p for p in out if tiny_serving_model.process_alive(p)]


def _log_of(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        return ""


def _kill_the_server_of(trial_dir: Path, model: Path, killed: list[str], deadline_s: float = 150) -> None:
    """Once `trial_dir` exists: SIGKILL the server it runs (one it started, once it listens, or the
    running one it reuses)."""
    end = time.monotonic() + deadline_s
    while not trial_dir.is_dir() and time.monotonic() < end:
        time.sleep(0.05)
    seen = time.monotonic()
    while time.monotonic() < end:
        own = [p for p in _servers(model) if _log_of(p).startswith(str(trial_dir))]
        log = trial_dir / "server.log"
        if own and "Uvicorn running" in (log.read_text(errors="replace") if log.is_file() else ""):
            victim = own[0]
        elif not log.exists() and time.monotonic() - seen > 2.0 and _servers(model):
            victim = _servers(model)[0]  # no restart in this trial: the reused server
        else:
            time.sleep(0.1)
            continue
        os.kill(victim, signal.SIGKILL)
        killed.append(f"{victim} {_log_of(victim) or log}")
        return


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("server_run")
    model = tiny_serving_model.cached_build(tmp_path_factory.getbasetemp())
    space, db = _space(root, model), root / "db" / "autoopt.sqlite"
    db.parent.mkdir()
    killed: list[str] = []
    runs = db.parent / "server_runs" / "tiny_transformers_serve"
    watcher = threading.Thread(target=_kill_the_server_of, args=(runs / KILLED_TRIAL_DIR, model, killed),
                               daemon=True)
    watcher.start()
    res = _autoopt("run", "--space", str(space), "--db", str(db), "--strategy", "random", "--seed", "3",
                   "--max-trials", "9", "--budget", "5m", "--no-confirm", "--json")
    watcher.join(5)
    assert res.returncode == 0, res.stderr[-3000:]
    assert not _servers(model), "a server outlived autoopt run"
    return {"root": root, "model": model, "space": space, "db": str(db), "run": json.loads(res.stdout),
            "killed": killed, "runs": runs}


def _history(db: str, study: str = "tiny_transformers_serve") -> dict:
    res = _autoopt("history", "--db", db, "--study", study, "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_run_tunes_three_restart_flags_and_a_request_field(study):
    trials = _history(study["db"])["trials"]
    ok = [t for t in trials if t["state"] == "ok"]
    assert len(trials) >= 9 and len(ok) >= 8
    for knob in RESTART_FLAGS + ("frequency_penalty",):
        assert len({json.dumps(t["params"][knob]) for t in ok}) == 2, f"{knob} was not tuned"
    assert all(t["objective"]["median"] > 1 for t in ok)


def test_restart_phases_are_in_the_store(study):
    shown = []
    for t in _history(study["db"])["trials"]:
        res = _autoopt("show", str(t["number"]), "--db", study["db"], "--study", "tiny_transformers_serve", "--json")
        assert res.returncode == 0, res.stderr
        shown.append(json.loads(res.stdout)["trial"])
    started = [s for s in shown if s["state"] == "ok" and s["costs_s"]["restart"] > 0]
    assert started, "no trial started a server"
    for s in started:
        c = s["costs_s"]
        assert c["launch"] >= 0 and c["ready"] > 0 and c["warm"] > 0
        assert c["restart"] == pytest.approx(c["launch"] + c["ready"] + c["warm"], abs=0.05)
        assert s["transition"]["actual_s"] == pytest.approx(c["restart"], rel=0.01)
        assert Path(s["what_ran"]["server_log"]).is_file() and Path(s["what_ran"]["bench_result"]).is_file()
        assert s["what_ran"]["server"].count("--dtype") == 1
        assert s["serving"]["2"]["median_ttft_ms"]["median"] > 0  # Measurement.serving


def test_kill_9_of_the_server_is_a_failed_trial_and_the_run_goes_on(study):
    assert study["killed"], "the watcher found no server to kill"
    trials = _history(study["db"])["trials"]
    failed = [t for t in trials if t["state"] != "ok"]
    assert len(failed) == 1, [t["failure"] for t in failed]
    assert failed[0]["failure"]["kind"] == "crash" and "SIGKILL" in failed[0]["failure"]["reason"]
    assert any(t["state"] == "ok" and t["number"] > failed[0]["number"] for t in trials)


def test_diff_and_best_export_on_the_study(study, tmp_path):
    trials = [t for t in _history(study["db"])["trials"] if t["state"] == "ok"]
    res = _autoopt("diff", str(trials[0]["number"]), str(trials[-1]["number"]), "--db", study["db"], "--study", "tiny_transformers_serve", "--json")
    assert res.returncode == 0, res.stderr
    res = _autoopt("best", "--db", study["db"], "--study", "tiny_transformers_serve", "--export", str(tmp_path / "best.yaml"), "--json",
                   "--trial", str(trials[-1]["number"]))
    assert res.returncode == 0, res.stderr
    doc = yaml.safe_load((tmp_path / "best.yaml").read_text())
    assert doc["kind"] == "server launch" and doc["server"]["argv"][:2] == ["transformers", "serve"]
    for flag in ("--dtype", "--attn-implementation"):
        assert doc["server"]["argv"].count(flag) == 1 and flag in doc["server"]["command_line"]
    assert ("--enable-cors" in doc["server"]["argv"]) == doc["knobs"]["enable_cors"]
    assert doc["server"]["request_fields"] == {"frequency_penalty": doc["knobs"]["frequency_penalty"]}
    assert doc["server"]["env"]["HF_HUB_OFFLINE"] == "1" and doc["space"]["changed_since_run"] is False
    assert doc["evidence"]["tok_per_s"][2]["median"] == pytest.approx(trials[-1]["objective"]["median"])


def _recorded_unchanged(study, before: dict) -> None:
    after = _history(study["db"])
    assert [t["number"] for t in after["trials"] if t["state"] == "ok"] == \
        [t["number"] for t in before["trials"] if t["state"] == "ok"]


def test_a_port_in_use_is_a_clear_error(study):
    before = _history(study["db"])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        space = _space(study["root"], study["model"], "port.yaml", port=str(port))
        res = _autoopt("run", "--space", str(space), "--db", study["db"], "--max-trials", "2", "--study", "port")
    assert res.returncode == 2 and res.stderr.startswith("error: ") and res.stderr.count("\n") == 1
    assert f"port {port} on 127.0.0.1 is in use" in res.stderr
    _recorded_unchanged(study, before)


def test_a_command_that_is_not_found_is_a_clear_error(study):
    before = _history(study["db"])
    space = _space(study["root"], study["model"], "missing.yaml",
                   command='[no-such-server-xyz, serve, "{model}", --port, "{port}"]')
    res = _autoopt("run", "--space", str(space), "--db", study["db"], "--max-trials", "2", "--study", "missing")
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "server.command[0]: 'no-such-server-xyz' is not found on PATH" in res.stderr
    _recorded_unchanged(study, before)


def test_a_server_that_never_becomes_ready_is_a_failed_trial(study):
    before = _history(study["db"])
    sleeper = json.dumps([sys.executable, "-c", "import time; time.sleep(120)", "{port}"])
    space = _space(study["root"], study["model"], "never.yaml", command=sleeper, ready_timeout_s=2)
    res = _autoopt("run", "--space", str(space), "--db", study["db"], "--max-trials", "2", "--study", "never",
                   "--json")
    assert res.returncode in (0, 1), res.stderr
    trials = _history(study["db"], "never")["trials"]
    assert trials and all(t["state"] == "failed" for t in trials)
    assert trials[0]["failure"]["kind"] == "hang" and "not ready after 2 s" in trials[0]["failure"]["reason"]
    _recorded_unchanged(study, before)
