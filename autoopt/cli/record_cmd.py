"""autoopt record: store a trial measured outside autoopt (parsing and printing only; the work is
autoopt.search.record)."""
from __future__ import annotations

from typing import List, Optional

import typer

from autoopt.cli.app import app
from autoopt.cli.history_cmd import DB_HELP
from autoopt.cli.suggest_cmd import BUDGET_LEFT, MIN_GAIN

EPILOG = ("Reads `vllm bench serve --save-result` JSON, SGLang bench_serving JSON lines, AIPerf's "
          "profile_export_aiperf.json or `autoopt bench-serve --save-result` (one file per concurrency "
          "or one for all; repeats pool). The study's first trial is its baseline; a trial is diagnosed "
          "against --parent (default: the study's latest successful trial). Nothing is written when an "
          "input is bad. Exit codes: 0 = recorded; 2 = bad input (a file, a knob, a value). Examples:\n\n"
          "  autoopt record --study mhc --space my_server.yaml --label defaults --bench c1.json --bench c16.json\n\n"
          "  autoopt record --study mhc --label \"mhc bf16, cast from fp32\" --set mhc_gemm=bf16 "
          "--bench r.json --trace t.json.gz --restart-s 480")


@app.command("record", epilog=EPILOG)
def record_command(
    study: str = typer.Option(..., "--study", help="Study to add the trial to (created with --space)."),
    label: str = typer.Option(..., "--label", help="What changed, in words (the trial's reason)."),
    bench: List[str] = typer.Option(..., "--bench", help="Result file (repeatable)."),
    sets: List[str] = typer.Option([], "--set", help="KNOB=VALUE of this trial (repeatable; the others "
                                   "keep the space's baseline values)."),
    trace: Optional[str] = typer.Option(None, "--trace", help="Chrome trace of the trial (*.json[.gz]): its buckets."),
    restart_s: float = typer.Option(0.0, "--restart-s", help="Seconds the change's restart took."),
    measure_s: Optional[float] = typer.Option(None, "--measure-s", help="Seconds of the sweep (default: "
                                              "the runs' own durations from the files)."),
    parent: Optional[int] = typer.Option(None, "--parent", help="Trial to diagnose against."),
    space: Optional[str] = typer.Option(None, "--space", help="Space file (knobs, values, objective); "
                                        "needed once per study."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", help="C of result files that do not say theirs."),
    min_gain: Optional[str] = MIN_GAIN,
    budget_left: Optional[str] = BUDGET_LEFT,
    as_json: bool = typer.Option(False, "--json", help="Print the document as JSON."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """Record a trial measured outside autoopt: store it, diagnose it, say whether to go on."""
    from autoopt.cli.render_history import print_json
    from autoopt.search.record import RecordOptions, record

    doc = record(RecordOptions(study=study, label=label, bench=list(bench), sets=list(sets), trace=trace,
                               restart_s=restart_s, measure_s=measure_s, parent=parent, space=space,
                               concurrency=concurrency, min_gain=min_gain, budget_left=budget_left, db=db))
    if as_json:
        print_json(doc)
        return
    who = "baseline" if doc["baseline"] else f"vs #{doc['parent']}" if doc["parent"] is not None else ""
    speed = f", x{doc['speedup']:.3f} over the baseline" if doc["speedup"] else ""
    print(f"study {doc['study']}: recorded trial #{doc['trial']} ({who}): {doc['objective']:.1f} tok/s{speed}")
    if doc["diagnosis"]:
        print(f"diagnosis: {doc['diagnosis']}")
    print(f"advice: {doc['advice']['line']}")
