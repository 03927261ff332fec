"""Regenerate README's screenshots from the committed H200 study (a temporary copy of it):

    docs/images/browse.svg         `autoopt browse` at 100x32, trial 20 under the cursor (Textual's SVG)
    docs/images/browse_plot.svg    its convergence plot
    docs/images/report.png         the top of `autoopt report`'s page in headless Chromium

    python docs/make_screenshots.py
"""
from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "images"


async def browse_shots(db: Path) -> None:
    from autoopt.cli.browse.app import BrowseApp
    from autoopt.store import Store

    with Store.open(str(db), create=False) as store:
        app = BrowseApp(store, "flash-h200")
        async with app.run_test(size=(100, 32)) as pilot:
            await pilot.pause()
            app.screen.query_one("#trials").move_cursor(row=20)
            await pilot.press("m")
            await pilot.pause()
            app.save_screenshot(str(OUT / "browse.svg"))
            await pilot.press("p")
            await pilot.pause()
            app.save_screenshot(str(OUT / "browse_plot.svg"))


def report_shot(db: Path, tmp: Path) -> None:
    subprocess.run([sys.executable, "-m", "autoopt.cli", "report", "--db", str(db), "--out", str(tmp / "r.html")],
                   check=True, cwd=ROOT, capture_output=True)
    browser = next(p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p)
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--screenshot={OUT / 'report.png'}", "--window-size=1000,1100", (tmp / "r.html").as_uri()],
                   check=True, capture_output=True, timeout=120)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        db = tmp / "h200.sqlite"
        shutil.copy(ROOT / "benchmarks" / "results" / "h200_study.sqlite", db)
        asyncio.run(browse_shots(db))
        report_shot(db, tmp)
    for p in sorted(OUT.iterdir()):
        print(p.relative_to(ROOT), p.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
