"""Reading big traces: the streaming reader gives what the whole-file reader gives, on every fixture
and across chunk boundaries that fall inside kernel names; the rules run once per distinct name."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from autoopt.errors import UserError
from autoopt.profile import chrome, rules
from autoopt.profile.trace import load_events, profile_events, profile_trace

ROOT = Path(__file__).resolve().parents[1]
TRACES = sorted((ROOT / "tests" / "fixtures" / "traces").glob("*.json.gz"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from profile_speed import make_trace  # noqa: E402


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_streamed_profile_equals_the_whole_file_profile(path):
    streamed = profile_trace(path).to_dict()
    whole = profile_events(load_events(path), label=str(path)).to_dict()
    streamed.pop("path")
    whole.pop("path")
    assert streamed == whole


def test_chunk_boundaries_inside_names_and_between_events(tmp_path, monkeypatch):
    path = tmp_path / "t.json.gz"
    make_trace(path, 3000)  # real H200 names: "{lambda()#1}, std::array<...>" inside strings
    events = load_events(path)
    doc = {"deviceProperties": [{"name": 'x}, {"y'}], "traceEvents": events, "after": {"a": 1}}
    plain = tmp_path / "t.json"
    plain.write_text(json.dumps(doc, indent=1))
    for chunk in (97, 1000, 4096):
        monkeypatch.setattr(chrome, "CHUNK_CHARS", chunk)
        monkeypatch.setattr(chrome, "BOUNDARY_WINDOW", chunk // 2 + 1)
        assert list(chrome.iter_events(path)) == events
        assert list(chrome.iter_events(plain)) == events


@pytest.mark.parametrize("text", ['{"traceEvents": [{"ph": "X"}, ', '[{"a": 1}, }', '{"x": [1, 2]}',
                                  '{"traceEvents": 5}', "not json", ""])
def test_broken_traces_are_user_errors_from_the_streaming_path(tmp_path, text):
    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(UserError, match=str(p)):
        profile_trace(p)


def test_rules_run_once_per_distinct_name(tmp_path):
    path = tmp_path / "t.json.gz"
    make_trace(path, 20000)
    names = {e["name"] for e in load_events(path)}
    rules.match.cache_clear()
    profile_trace(path)
    info = rules.match.cache_info()
    assert info.misses <= 2 * len(names) and info.hits > 10 * info.misses, info
