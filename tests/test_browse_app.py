"""`autoopt browse` driven headless with Textual's pilot on a copy of the committed H200 study:
studies list -> trials table, sort, filter, detail, mark two and diff, plots, help, escaping; the
rendered text of each main screen at 80x24; and no torch imported."""
from __future__ import annotations

import asyncio
import io
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from autoopt.cli.browse.app import BrowseApp
from autoopt.store.reading import SqliteReader, open_for_reading
from autoopt.store.reports import diff, history

ROOT = Path(__file__).resolve().parents[1]
STUDY_DB = ROOT / "benchmarks" / "results" / "h200_study.sqlite"
SIZE = (80, 24)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    path = tmp_path / "h200.sqlite"
    shutil.copy(STUDY_DB, path)  # never the committed file
    return path


@pytest.fixture
def store(db_path: Path):
    with open_for_reading(str(db_path)) as s:  # what `autoopt browse` opens: sqlite3, no SQLAlchemy
        assert isinstance(s, SqliteReader)
        yield s


def screen_text(app: BrowseApp) -> str:
    """What the terminal shows now, as plain text (the render export_screenshot makes an SVG of)."""
    width, height = app.size
    con = Console(width=width, height=height, file=io.StringIO(), force_terminal=True, color_system=None,
                  record=True, legacy_windows=False)
    con.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return con.export_text()


def table_numbers(app: BrowseApp) -> list[int]:
    table = app.screen.query_one("#trials")
    return [int(k.value) for k in (table.coordinate_to_cell_key((i, 0)).row_key for i in range(table.row_count))]


def run(coro) -> None:
    asyncio.run(coro)


async def _open(pilot) -> None:
    await pilot.pause()
    await pilot.press("enter")  # the studies list -> the only study
    await pilot.pause()


def test_studies_list_then_trials_table(store) -> None:
    doc = history(store, "flash-h200")

    async def go() -> None:
        app = BrowseApp(store)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            text = screen_text(app)
            assert "flash-h200" in text and "82" in text and "2 failed, 80 ok" in text
            await _open(pilot)
            assert type(app.screen).__name__ == "TrialsScreen"
            assert table_numbers(app) == [r["number"] for r in doc["trials"]]
            text = screen_text(app)
            lines = text.splitlines()
            assert len(lines) == 24 and all(len(line) <= 80 for line in lines)
            assert lines[0].rstrip() == "flash-h200  82 trials (2 failed, 80 ok)  baseline #0  best #59"
            assert lines[1].rstrip() == "objective tok_per_s@mix of C=1:0.2 C=16:0.3 C=64:0.5 (tok/s, higher is better)"
            assert " #     state   tok/s [95% CI]           speed-up   cost   source" in text  # the unit
            assert "  0b   ok      248.7 [244.3, 253.9]     1.000x     12.3s  baseline" in text  # the baseline (its mix), marked b
            assert "trial 0  ok (baseline)" in text  # the detail pane follows the cursor
            assert lines[-1].strip() == "s Sort  f Filter  x Failed  m Mark  d Diff  p Plot  ? Help  q Quit"
    run(go())


def test_sort_reverse_and_best_marked(store) -> None:
    best_first = [r["number"] for r in history(store, "flash-h200", sort="objective")["trials"]]

    async def go() -> None:
        app = BrowseApp(store, "flash-h200")
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await pilot.press("s")  # number -> objective
            await pilot.pause()
            assert table_numbers(app) == best_first
            assert "sort objective (natural)" in screen_text(app)
            await pilot.press("r")
            await pilot.pause()
            ok_worst_first = [n for n in best_first[::-1] if n not in (18, 34)]
            assert table_numbers(app)[:len(ok_worst_first)] == ok_worst_first  # figureless rows stay last
            await pilot.press("r", "b")
            await pilot.pause()
            assert app.screen.current_number() == 59
            assert "59★" in screen_text(app)
    run(go())


def test_filter_by_knob_state_source_and_failed(store) -> None:
    rows = history(store, "flash-h200")["trials"]
    triton = [r["number"] for r in rows if r["params"]["glue"] == "triton"]
    profile_ok = [r["number"] for r in rows if (r["source"] or "").startswith("profile") and r["state"] == "ok"]

    async def go() -> None:
        app = BrowseApp(store, "flash-h200")
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await pilot.press("x")
            await pilot.pause()
            assert table_numbers(app) == [18, 34]
            await pilot.press("x", "f")
            await pilot.pause()
            app.screen.query_one("#filter").value = ""
            await pilot.press(*"glue=triton", "enter")  # typed key by key
            await pilot.pause()
            assert table_numbers(app) == triton
            await _filter(app, pilot, "state=ok source=profile")
            assert table_numbers(app) == profile_ok
            await _filter(app, pilot, "no_such_knob=1")
            assert type(app.screen).__name__ == "FilterScreen"  # stays open, says why
            assert "error: 'no_such_knob' is not state, source or a knob" in screen_text(app)
            await pilot.press("escape")
            await pilot.pause()
            assert table_numbers(app) == profile_ok  # the old filter kept
    run(go())


async def _filter(app: BrowseApp, pilot, text: str) -> None:
    await pilot.press("f")
    await pilot.pause()
    app.screen.query_one("#filter").value = text
    await pilot.press("enter")
    await pilot.pause()


async def _cursor_to(app: BrowseApp, pilot, number: int) -> None:
    app.screen.query_one("#trials").move_cursor(row=table_numbers(app).index(number))
    await pilot.pause()


def test_open_a_trial_and_a_failed_one(store) -> None:
    async def go() -> None:
        app = BrowseApp(store, "flash-h200")
        async with app.run_test(size=(100, 60)) as pilot:
            await pilot.pause()
            await _cursor_to(app, pilot, 20)
            await pilot.press("enter")
            await pilot.pause()
            assert type(app.screen).__name__ == "DetailScreen"
            text = screen_text(app)
            for want in ("trial 20  ok", "tok/s per concurrency", "8179.7 [8162.0, 8200.9]", "MBU",
                         "buckets: ", "gemm_tensorop", "cost by phase", "why chosen, predicted vs measured",
                         "+1.0% ± 30.2% over the incumbent", "+284.1% over the same incumbent", "diagnosis: predicted +1.0%"):
                assert want in text, want
            await pilot.press("end")
            await pilot.pause()
            assert "configuration by layer" in screen_text(app)
            await pilot.press("escape")
            await _cursor_to(app, pilot, 18)
            await pilot.press("enter")
            await pilot.pause()
            text = screen_text(app)
            assert "trial 18  failed" in text and "exception: OutOfResources: out of resource: shared memory" in text
            assert "worker stderr (last 20 lines):" in text
    run(go())


def test_mark_two_and_diff(store) -> None:
    want = diff(store, 2, 3, "flash-h200")

    async def go() -> None:
        app = BrowseApp(store, "flash-h200")
        async with app.run_test(size=(100, 50)) as pilot:
            await pilot.pause()
            await pilot.press("d")
            await pilot.pause()
            assert "mark two trials" in screen_text(app)
            await pilot.press("down", "down", "m", "down", "m")
            await pilot.pause()
            assert app.screen.marked == [2, 3]
            assert "marked 2, 3" in screen_text(app) and "●2" in screen_text(app)
            await pilot.press("d")
            await pilot.pause()
            assert type(app.screen).__name__ == "DiffScreen"
            text = screen_text(app)
            assert "A = trial 2 ok   B = trial 3 ok" in text
            assert f"verdict: {want['verdict']}"[:60] in text.replace("\n", " ")
            for k in want["knobs"]:
                assert k["name"] in text
            assert "-13.5% [-17.3, -7.9]  slower" in text  # C=64, from the diff document
            assert "buckets (ms per decode step)" in text
    run(go())


def test_plots_and_help(store) -> None:
    async def go() -> None:
        app = BrowseApp(store, "flash-h200")
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await pilot.press("p")
            await pilot.pause()
            text = screen_text(app)
            lines = text.splitlines()
            assert lines[0].startswith("speed-up over the baseline at tok_per_s@mix")
            assert "run 2 joined at 7m" in text and "●" in text and "✗" in text and "┊" in text
            assert all(len(line) <= 80 for line in lines)
            await pilot.press("e")
            await pilot.pause()
            text = screen_text(app)
            assert "indexer_gemm=bf16            65 x11.306 [11.166, 11.390]" in text
            await pilot.press("escape", "?")
            await pilot.pause()
            text = screen_text(app)
            assert "autoopt browse: keys" in text and "Knob effects" in text and "m / space" in text
    run(go())


def test_user_data_is_not_markup(db_path: Path) -> None:
    """A reason and a failure containing rich markup show as typed (and do not crash the render)."""
    reason, failure = "[bold red]not bold[/] [link=http://x]y[/link]", "boom [/] [red"
    with sqlite3.connect(db_path) as conn:
        conn.execute("UPDATE autoopt_trials SET decision_source=?, decision_reason=? WHERE number=1",
                     ("[blink]src", reason))
        conn.execute("UPDATE autoopt_trials SET failure_reason=? WHERE number=18", (failure,))

    async def go() -> None:
        with open_for_reading(str(db_path)) as store:
            app = BrowseApp(store, "flash-h200")
            async with app.run_test(size=(160, 50)) as pilot:
                await pilot.pause()
                await pilot.press("down")
                await pilot.pause()
                assert "[blink]src" in screen_text(app)  # the table
                await pilot.press("enter")
                await pilot.pause()
                text = screen_text(app)
                assert "[blink]src" in text and reason in text  # the trial's screen
                await pilot.press("escape")
                await _cursor_to(app, pilot, 18)
                assert failure in screen_text(app)
    run(go())


def test_browse_never_imports_torch(db_path: Path) -> None:
    """Nor triton, optuna or SQLAlchemy: a SQLite study is read through sqlite3 (0.35 s of CPU saved)."""
    code = ("import asyncio, sys\n"
            "from autoopt.cli import app\n"
            "from autoopt.cli.browse.app import BrowseApp\n"
            "from autoopt.store.reading import open_for_reading\n"
            "async def go():\n"
            f"    with open_for_reading({str(db_path)!r}) as s:\n"
            "        a = BrowseApp(s)\n"
            "        async with a.run_test(size=(80, 24)) as p:\n"
            "            await p.press('enter', 'p', 'escape', 'e', 'escape', 'enter', 'escape', '?')\n"
            "            await p.pause()\n"
            "asyncio.run(go())\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', 'optuna', 'sqlalchemy'))\n"
            "print('heavy:', bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "heavy: []" in out.stdout
