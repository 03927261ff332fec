"""Terminal output keeps every label and fits 80 columns (issue 12, item 7): `show` prints knob keys
like `mhc_gemm[c4]` as data, not rich markup; `history` wraps at 80 columns with the best marked and
has --wide; the live view wraps its why line; bad --objective / --export are one-line errors."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from store_helpers import STUDY, build_case_study, measurement, run_trial

from autoopt.store import Store

ROOT = Path(__file__).resolve().parents[1]
LABELS = ("mhc_gemm[window]", "mhc_gemm[c4]", "mhc_gemm[c128]", "attention[c4]", "moe[c128]")


def autoopt(db: Path, *args: str, columns: int = 80) -> subprocess.CompletedProcess:
    env = dict(os.environ, AUTOOPT_DB=f"sqlite:///{db}", COLUMNS=str(columns), NO_COLOR="1")
    return subprocess.run([sys.executable, "-m", "autoopt.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120)


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("render") / "r.sqlite"
    with Store.open(str(path)) as store:
        build_case_study(store)
        run_id = store.start_run(STUDY, "autoopt run", "dsv4-gemm", "cd" * 32, "builtin", "tiny", 7,
                                 {"objective": "tok_per_s@16", "concurrency": [1, 16, 64]})
        params = {"mhc_gemm": "bf16", "mhc_operand": "view_bf16_residual"}
        m = measurement(params, {16: 64.0})
        m.what_ran = {label: f"ran {label}" for label in LABELS}
        m.config = {**params, **{label: "bf16" for label in LABELS}}
        run_trial(store, run_id, params, m, source="profile:[gemm]", reason="why " * 40 + "[end]")
    return path


def test_show_keeps_bracketed_labels(db):
    r = autoopt(db, "show", "5", columns=120)
    assert r.returncode == 0, r.stderr
    for label in LABELS:
        assert label in r.stdout, label  # rich would print "mhc_gemm" alone for "mhc_gemm[c4]"
        assert f"ran {label}" in r.stdout
    assert "[end]" in r.stdout  # the why line, in full


def test_history_at_80_columns_wraps_marks_the_best_and_cuts_nothing(db):
    r = autoopt(db, "history")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    body = lines[1:-1]  # header and legend are single logical lines the terminal may wrap
    assert max(len(x) for x in body) <= 80, max(body, key=len)
    assert "…" not in r.stdout
    assert "mhc_gemm=bf16, mhc_operand=view_bf16_residual" in r.stdout  # the changes, whole
    assert "oom: CUDA out of memory at batch 64" in r.stdout
    assert "profile:[gemm]" in r.stdout  # a source with brackets, kept
    best = [x for x in body if x.lstrip().startswith(">")]
    assert len(best) == 1 and best[0].split()[0] == ">2", best
    assert "> = the best (autoopt best: trial 2)" in lines[-1]
    assert any(x.split()[0] == "0b" for x in body if x.split())  # the baseline marked


def test_history_wide_is_one_line_per_trial(db):
    r = autoopt(db, "history", "--wide")
    assert r.returncode == 0, r.stderr
    rows = [x for x in r.stdout.splitlines() if "│" in x]
    assert len(rows) == 6 and any("mhc_gemm=bf16, mhc_operand=view_bf16_residual" in x for x in rows)


@pytest.mark.parametrize("cmd", ["history", "best"])
def test_objective_at_an_unmeasured_concurrency_names_the_measured_ones(db, cmd):
    r = autoopt(db, cmd, "--objective", "tok_per_s@999")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --objective tok_per_s@999"), r.stderr
    assert "tok_per_s@1, tok_per_s@16, tok_per_s@64" in lines[0]


def test_best_export_into_a_directory_or_a_missing_one_is_refused(db, tmp_path):
    for target, needle in ((tmp_path, "is a directory"), (tmp_path / "nope" / "c.yaml", "does not exist")):
        r = autoopt(db, "best", "--export", str(target))
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert not (tmp_path / "nope").exists()


def test_live_view_wraps_the_why_line():
    from autoopt.cli.live_view import LiveView

    with open(os.devnull, "w") as sink:
        view = LiveView(live=False, stream=sink)
        view._last_reason = "profile:attention: " + "because " * 30 + "[the end]"
        con = Console(width=80, record=True, force_terminal=False)
        con.print(view._render())
    text = con.export_text()
    assert "[the end]" in text and max(len(x) for x in text.splitlines()) <= 80


def test_guard_margin_is_shown_against_the_tolerance():
    """A pass at 97 % of the allowed error is not a plain "ok" (issue 12 item 4)."""
    from autoopt.cli.render import verdict_text
    from autoopt.store.analysis import guard_margins

    near = {"verdict": "ok", "logits_rel_err": 0.0778, "token_agreement": 0.67,
            "tolerance": {"logits_rel_err": 0.08, "token_agreement": 0.5, "class": "bf16"}}
    assert guard_margins(near) == pytest.approx({"logits_rel_err": 0.9725, "token_agreement": 0.66})
    text = verdict_text(near).plain
    assert "ok, near the tolerance" in text and "7.78e-02 / 8.00e-02 allowed = 97%" in text
    assert "needs >= 50%" in text
    far = dict(near, logits_rel_err=0.004, token_agreement=1.0)
    assert verdict_text(far).plain.startswith("correctness: ok (")
