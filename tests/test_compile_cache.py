"""Inductor's and Triton's on-disk caches are kept per study beside the database (autoopt.search.compile_cache),
so a restarted or resumed worker finds what an earlier one compiled: the worker's environment holds
them (a real worker process) and each trial records where its worker kept them (what_ran)."""
from __future__ import annotations

from pathlib import Path

import pytest

from autoopt.search import compile_cache
from autoopt.search.session import open_target
from autoopt.targets.base import EvalRequest
from autoopt.targets.builtin.client import COMPILE_CACHE_ENV, WorkerClient, with_compile_cache


@pytest.fixture(autouse=True)
def no_cache_dir_inherited(monkeypatch):
    """A user's own setting is kept (a test below), so none may leak in: an earlier test of the suite
    that compiles in-process leaves Inductor's default (/tmp/torchinductor_<user>) in os.environ,
    which Inductor writes there itself for its subprocesses."""
    for name in COMPILE_CACHE_ENV.values():
        monkeypatch.delenv(name, raising=False)


def test_the_directory_is_per_study_beside_the_sqlite_file(tmp_path):
    db = tmp_path / "db" / "autoopt.sqlite"
    assert compile_cache.directory(f"sqlite:///{db}", "flash-h200") == tmp_path / "db" / "cache" / "flash-h200"
    # a study name is one directory, whatever it holds
    assert compile_cache.directory(f"sqlite:///{db}", "../a/b c") == tmp_path / "db" / "cache" / "_a_b_c"
    assert compile_cache.directory("postgresql://u@h/autoopt", "s").parts[-2:] == ("autoopt", "s")


def test_a_worker_started_with_it_has_both_caches_in_its_environment(tmp_path):
    env = with_compile_cache(None, tmp_path / "cache" / "s")
    with WorkerClient("cpu", env=env) as client:
        seen = client.hello["compile_cache"]
    assert seen == {"inductor": str(tmp_path / "cache" / "s" / "inductor"),
                    "triton": str(tmp_path / "cache" / "s" / "triton")}
    assert all(Path(p).is_dir() for p in seen.values())


def test_a_cache_directory_the_user_set_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv(COMPILE_CACHE_ENV["triton"], str(tmp_path / "mine"))
    env = with_compile_cache(None, tmp_path / "cache" / "s")
    assert env[COMPILE_CACHE_ENV["triton"]] == str(tmp_path / "mine")
    assert env[COMPILE_CACHE_ENV["inductor"]] == str(tmp_path / "cache" / "s" / "inductor")


def test_a_run_s_builtin_target_measures_with_the_study_s_cache_and_records_it(tmp_path):
    directory = compile_cache.directory(f"sqlite:///{tmp_path / 'autoopt.sqlite'}", "tiny study")
    target = open_target("builtin", "tiny", "cpu", compile_cache=directory)
    target.guard = False  # the guard is not what this is about; it only costs time
    try:
        m = target.evaluate(EvalRequest(config=target.baseline(), concurrency=(1,), min_samples=3,
                                        max_samples=3, time_limit_s=240))
    finally:
        target.close()
    assert m.status == "ok", m.failure
    assert m.what_ran["compile_cache"] == (f"inductor {tmp_path / 'cache' / 'tiny_study' / 'inductor'}; "
                                           f"triton {tmp_path / 'cache' / 'tiny_study' / 'triton'}")
