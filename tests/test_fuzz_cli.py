"""Fuzz the CLI in a subprocess with mutated inputs: space files, config files, Chrome traces, replay
tables and command lines (hypothesis, derandomised: the same examples on every machine and in CI).

For every example: no Python traceback, every non-zero exit is 1 or 2, a failing exit prints exactly
one `error:` line, and a database the command ran against still opens and reads afterwards
(`PRAGMA integrity_check` and `autoopt history` both succeed). Bounded so the whole file runs in
under 2 minutes on a 2-core CPU.
"""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from store_helpers import build_case_study

from autoopt.store import Store

ROOT = Path(__file__).resolve().parents[1]
FUZZ = settings(derandomize=True, deadline=None, database=None, print_blob=True,
                phases=[Phase.explicit, Phase.generate],  # no shrinking: each example is a process
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
TOKENS = ["-1", "0", "1e309", "99999999999", "null", "[]", "{}", '"x"', "true", "NaN", "'", ":",
          "\x00", "é", "[c4]", "mhc_gemm", "bf1", "- ", "\n", "{", "]", "@", ",,", "==", "\t"]


@st.composite
def mutated(draw, seed: str, max_edits: int = 4) -> str:
    """`seed` with a few edits: cut, deleted span, inserted token, or a token in place of a span."""
    text = seed
    for _ in range(draw(st.integers(1, max_edits))):
        i = draw(st.integers(0, len(text)))
        j = min(len(text), i + draw(st.integers(0, 40)))
        op = draw(st.sampled_from(["cut", "delete", "insert", "replace"]))
        tok = draw(st.sampled_from(TOKENS) | st.text(max_size=6))
        text = {"cut": text[:i], "delete": text[:i] + text[j:], "insert": text[:i] + tok + text[i:],
                "replace": text[:i] + tok + text[j:]}[op]
    return text


def run_cli(*args: str, db: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="100", NO_COLOR="1")
    if db is not None:
        env["AUTOOPT_DB"] = f"sqlite:///{db}"
    return subprocess.run([sys.executable, "-m", "autoopt.cli", *args], capture_output=True,
                          text=True, errors="replace", cwd=ROOT, env=env, timeout=timeout)


def assert_clean(r: subprocess.CompletedProcess) -> None:
    out = r.stdout + r.stderr
    assert "Traceback (most recent call last)" not in out, out[-3000:]
    assert r.returncode in (0, 1, 2), (r.returncode, out[-2000:])
    if r.returncode == 2:
        errors = [x for x in r.stderr.splitlines() if x.startswith("error:")]
        assert len(errors) == 1, r.stderr[-2000:]


def assert_db_readable(db: Path) -> None:
    con = sqlite3.connect(db)
    try:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        con.close()
    r = run_cli("history", "--json", db=db)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.fixture(scope="module")
def study_db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fuzz") / "study.sqlite"
    with Store.open(str(path)) as store:
        build_case_study(store)
    return path


def _write(tmp: Path, name: str, text: str) -> Path:
    p = tmp / name
    p.write_text(text, encoding="utf-8", errors="surrogatepass")
    return p


def _small_trace() -> str:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from profile_speed import make_trace

    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "t.json.gz"
        make_trace(p, 1200)
        from autoopt.profile.chrome import load_events
        return json.dumps({"traceEvents": load_events(p)[:60]})


TRACE = _small_trace()
SPACE = (ROOT / "search_spaces" / "dsv4_tiny_cpu.yaml").read_text()
CONFIG = (ROOT / "benchmarks" / "results" / "h200_best_config.yaml").read_text()
TABLE = "\n".join((ROOT / "benchmarks" / "data" / "tiny_cpu_grid.csv").read_text().splitlines()[:12])


@settings(FUZZ, max_examples=12)
@given(text=mutated(TRACE))
def test_fuzz_profile_traces(tmp_path_factory, text):
    tmp = tmp_path_factory.mktemp("trace")
    assert_clean(run_cli("profile", str(_write(tmp, "t.json", text)), "--top", "3"))


@settings(FUZZ, max_examples=10)
@given(text=mutated(SPACE))
def test_fuzz_space_files(tmp_path_factory, text):
    tmp = tmp_path_factory.mktemp("space")
    assert_clean(run_cli("spaces", str(_write(tmp, "s.yaml", text))))


@settings(FUZZ, max_examples=10)
@given(text=mutated(CONFIG))
def test_fuzz_config_files(tmp_path_factory, text):
    # a concurrency no host holds: a valid config is refused before a worker starts (limits.py)
    tmp = tmp_path_factory.mktemp("config")
    assert_clean(run_cli("measure", "--config", str(_write(tmp, "c.yaml", text)),
                         "--concurrency", "100000000"))


@settings(FUZZ, max_examples=6)
@given(text=mutated(TABLE, max_edits=3))
def test_fuzz_replay_tables(tmp_path_factory, text):
    tmp = tmp_path_factory.mktemp("table")
    db = tmp / "run.sqlite"
    table = _write(tmp, "t.csv", text)
    r = run_cli("run", "--target", f"replay:{table}", "--max-trials", "3", "--study", "fuzz",
                db=db, timeout=90)
    assert_clean(r)
    if db.exists() and r.returncode == 0:
        assert_db_readable(db)


COMMANDS = st.sampled_from(["history", "show", "best", "diff", "profile", "measure", "run",
                            "spaces", "bench-search"])
ARGS = st.sampled_from(["--objective", "tok_per_s@999", "tok_per_s@16", "--limit", "0", "-3",
                        "--sort", "bogus", "objective", "--trial", "99", "abc", "1", "0", "--json",
                        "--export", "/nonexistent/dir/c.yaml", "--study", "nope", "--wide",
                        "--failed", "--concurrency", "1,,4", "--seed", "-1", "--timeout", "0",
                        "--shape", "hidden=-5", "--set", "mhc_gemm=bf1", "--vs", "--budget",
                        "2x", "[c4]", "--help"])


@settings(FUZZ, max_examples=16)
@given(cmd=COMMANDS, args=st.lists(ARGS, max_size=5))
def test_fuzz_command_lines(study_db, tmp_path_factory, cmd, args):
    tmp = tmp_path_factory.mktemp("argv")
    db = tmp / "study.sqlite"
    shutil.copy(study_db, db)
    if cmd in ("measure", "run") and "--help" not in args:
        args = [*args, "--concurrency", "100000000"] if cmd == "measure" else [*args, "--max-trials", "0"]
    assert_clean(run_cli(cmd, *args, db=db, timeout=90))
    assert_db_readable(db)
