"""`autoopt report` on a copy of the committed H200 study: the page and its PNGs are written, the page
needs no network, and a real headless Chromium renders its plots with no script error."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from autoopt.store import Store
from autoopt.store.reports import history

ROOT = Path(__file__).resolve().parents[1]
STUDY_DB = ROOT / "benchmarks" / "results" / "h200_study.sqlite"
PLOTS = ("convergence", "effects", "buckets", "predictions")


def chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def autoopt(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autoopt.cli", *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("report")
    db = tmp / "h200.sqlite"
    shutil.copy(STUDY_DB, db)
    out = autoopt("report", "--db", str(db), "--out", str(tmp / "h200.html"))
    assert out.returncode == 0, out.stderr
    with Store.open(str(db), create=False) as store:
        rows = history(store, "flash-h200")["trials"]
    return {"dir": tmp, "html": tmp / "h200.html", "stdout": out.stdout, "rows": rows}


def test_files_written_and_self_contained(report: dict) -> None:
    html = report["html"].read_text()
    printed = report["stdout"].split()
    assert printed[0] == str(report["html"])
    for name in PLOTS:
        png = report["dir"] / f"h200-{name}.png"
        assert str(png) in printed
        with Image.open(png) as im:
            assert im.format == "PNG" and im.width >= 600 and len(im.getcolors(1 << 16) or []) > 8
        assert f'href="h200-{name}.png"' in html
    assert html.count("<svg ") == 4
    # nothing is fetched at view time: no external script, style, image, font or frame
    assert not re.search(r'<(script|link|img|iframe)[^>]+(src|href)=', html)
    assert "url(" not in html and "@import" not in html


def test_user_data_escaped(report: dict) -> None:
    html = report["html"].read_text()
    assert "<script>" in html and html.count("<script") == 1  # only ours
    assert "OutOfResources: out of resource: shared memory" in html


def _chromium_run(browser: str, *args: str) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
             "--no-first-run", "--disable-extensions"]
    return subprocess.run([browser, *flags, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_renders_in_headless_chromium(report: dict, tmp_path: Path) -> None:
    browser = chromium()
    if browser is None:
        pytest.skip("chromium not installed")
    url = report["html"].as_uri()
    dom = _chromium_run(browser, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "Uncaught" not in dom.stderr, dom.stderr
    assert 'data-sortable="ready"' in dom.stdout  # our script ran to its end
    ok = [r for r in report["rows"] if r["state"] == "ok" and r["speedup"]]
    assert dom.stdout.count('class="trial"') == len(ok) == 80  # one marker per successful trial
    assert dom.stdout.count('class="best-so-far"') == 1
    assert dom.stdout.count('class="bucket"') > 100 and dom.stdout.count('class="prediction"') == 78
    assert dom.stdout.count('class="effect"') > 40
    shot = tmp_path / "report.png"
    run = _chromium_run(browser, f"--screenshot={shot}", "--window-size=1000,1400", url)
    assert "Uncaught" not in run.stderr, run.stderr
    with Image.open(shot) as im:
        rgb = im.convert("RGB")
        colors = rgb.getcolors(1 << 20) or []
        not_white = sum(n for n, c in colors if c != (255, 255, 255))
        assert im.size == (1000, 1400)
        assert not_white > 0.03 * 1000 * 1400  # text and plots, not a blank page
        green = sum(n for n, (r, g, b) in colors if g > 100 and r < 80 and b < 80)
        assert green > 200  # the convergence plot's markers (#2e7d32) painted


@pytest.mark.slow
def test_a_script_error_would_be_caught(report: dict, tmp_path: Path) -> None:
    """The console check above can fail: the same page with a broken script logs "Uncaught"."""
    browser = chromium()
    if browser is None:
        pytest.skip("chromium not installed")
    broken = tmp_path / "broken.html"
    broken.write_text(report["html"].read_text().replace("</body>", "<script>nosuchfunction();</script></body>"))
    dom = _chromium_run(browser, "--dump-dom", broken.as_uri())
    assert "Uncaught" in dom.stderr


def test_out_directory_and_errors(tmp_path: Path) -> None:
    db = tmp_path / "h200.sqlite"
    shutil.copy(STUDY_DB, db)
    out = autoopt("report", "--db", str(db), "--out", str(tmp_path / "rep"))
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in (tmp_path / "rep").iterdir()) == sorted(
        ["report.html"] + [f"{n}.png" for n in PLOTS])
    missing = autoopt("report", "--db", str(db), "--out", str(tmp_path / "no" / "such" / "r.html"))
    assert missing.returncode == 2 and missing.stderr.startswith("error: --out ")
    assert "does not exist" in missing.stderr and len(missing.stderr.strip().splitlines()) == 1
    study = autoopt("report", "--db", str(db), "--study", "nope", "--out", str(tmp_path / "x.html"))
    assert study.returncode == 2 and "no study 'nope'" in study.stderr
    assert not (tmp_path / "x.html").exists()
