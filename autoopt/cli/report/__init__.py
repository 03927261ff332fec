"""`autoopt report`: one study as a self-contained HTML page (svg.py draws, page.py lays out) with a
PNG of each plot beside it (png.py). The series come from autoopt.cli.browse.plots, the same as the
terminal browser's, read through StudySource (the history / show documents)."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoopt.cli.browse import plots
from autoopt.cli.browse.data import StudySource
from autoopt.errors import UserError

PLOTS = ("convergence", "effects", "buckets", "predictions")


@dataclass(frozen=True)
class ReportFiles:
    html: Path
    pngs: dict[str, Path]


def output_paths(out: str | Path) -> tuple[Path, str]:
    """--out FILE.html -> (that file, PNG prefix "FILE-"); --out DIR -> (DIR/report.html, no prefix).
    UserError when the place cannot be written."""
    out = Path(out)
    if out.suffix.lower() in (".html", ".htm"):
        if not out.parent.is_dir():
            raise UserError(f"--out {out}: directory {out.parent} does not exist")
        if out.is_dir():
            raise UserError(f"--out {out}: is a directory; give a file name ending in .html or a directory")
        return out, f"{out.stem}-"
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: expected a directory or a file name ending in .html")
    if not out.exists():
        if not out.parent.is_dir():
            raise UserError(f"--out {out}: directory {out.parent} does not exist")
        out.mkdir()
    return out / "report.html", ""


def _series(source: StudySource) -> dict[str, Any]:
    rows = list(source.rows.values())
    details = source.details()
    names, bucket_rows = plots.buckets(details)
    return {"convergence": plots.convergence(rows, plots.restart_classes(details), source.objective),
            "effects": plots.effects(rows), "buckets": (names, bucket_rows),
            "predictions": plots.predictions(details)}


def _has_data(name: str, series: Any) -> bool:
    if name == "convergence":
        return bool(series.points)
    if name == "buckets":
        return bool(series[1])
    return bool(series)


def build_report(store: Any, study: str | None, out: str | Path) -> ReportFiles:
    from autoopt.cli.report import page, png, svg

    html_path, prefix = output_paths(out)
    study = store.resolve_study(study)
    source = StudySource(store, study)
    if not source.rows:
        raise UserError(f"study {study!r} has no trials yet: nothing to report")
    series = _series(source)
    captions = {
        "convergence": "each finished trial's speed-up (with its interval) and the best so far (autoopt best's "
                       "rule) against wall time; dashed verticals: a later autoopt run joined the study",
        "effects": "per-knob effects: for each value, the median speed-up of the successful trials that had it, "
                   "with a distribution-free 95% CI (binomial order statistics); marginal, not controlled: "
                   "those trials differ in other knobs too",
        "buckets": "profile buckets per trial: ms per decode step by bucket, for every profiled trial",
        "predictions": "predicted vs measured: each decision's expected gain over its incumbent (± 1 sd) against "
                       "the gain measured; points on the dashed line were predicted exactly",
    }
    draw_svg = {"convergence": svg.convergence, "effects": svg.effects,
                "buckets": lambda s: svg.buckets(*s), "predictions": svg.predictions}
    draw_png = {"convergence": png.convergence, "effects": png.effects,
                "buckets": lambda s, p: png.buckets(s[0], s[1], p), "predictions": png.predictions}
    sections, pngs = [], {}
    for name in PLOTS:
        if not _has_data(name, series[name]):
            sections.append((name, page.figure(None, captions[name], None)))
            continue
        pngs[name] = draw_png[name](series[name], html_path.parent / f"{prefix}{name}.png")
        sections.append((name, page.figure(draw_svg[name](series[name]), captions[name], pngs[name].name)))
    generated = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    html_path.write_text(page.page(study, source.head, list(source.rows.values()), source.best_number(),
                                   sections, generated), encoding="utf-8")
    return ReportFiles(html_path, pngs)
