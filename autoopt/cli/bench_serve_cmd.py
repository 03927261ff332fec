"""autoopt bench-serve: load-test a running OpenAI-compatible server (parsing and rendering only; the
work is autoopt.targets.server.loadgen)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from autoopt.cli.app import app


def _concurrency(text: str) -> tuple[int, ...]:
    from autoopt.errors import UserError

    try:
        values = tuple(dict.fromkeys(int(x) for x in text.split(",") if x.strip()))
    except ValueError:
        values = ()
    if not values or min(values) <= 0:
        raise UserError(f"--concurrency: expected positive integers separated by commas (1,4,16); got {text!r}")
    return values


def _served_model(url: str) -> str:
    """The first model the server lists at /v1/models (UserError when it lists none)."""
    import http.client

    from autoopt.errors import UserError
    from autoopt.targets.server.http_stream import Endpoint

    ep = Endpoint.parse(url)
    cls = http.client.HTTPSConnection if ep.scheme == "https" else http.client.HTTPConnection
    conn = cls(ep.host, ep.port, timeout=10)
    try:
        conn.request("GET", ep.base_path + "/v1/models")
        resp = conn.getresponse()
        body = resp.read()
        models = [m.get("id") for m in json.loads(body).get("data", [])] if resp.status == 200 else []
    except (OSError, http.client.HTTPException, ValueError, AttributeError) as exc:
        raise UserError(f"{url}: cannot reach the server ({exc}); is it running?") from None
    finally:
        conn.close()
    if not models:
        raise UserError(f"{ep.url}/v1/models lists no model: give the model to request with --model")
    return str(models[0])


def _render(doc: dict[str, Any], objective: str) -> str:
    from autoopt.cli.render import fmt_num, fmt_tok_s

    lines = [f"{doc['base_url']}{doc['endpoint']}  model {doc['model_id']}  "
             f"prompt {doc['workload']['prompt_tokens']} tok ({doc['prompt_tokens_source']}), "
             f"output {doc['workload']['output_tokens']} tok, {doc['workload']['repeats']} repeats"]
    lines += [f"note: {n}" for n in doc["notes"]]
    for r in doc["results"]:
        s = r["summary"]
        c = r["max_concurrency"]
        lat = "  ".join(f"{m.upper()} {fmt_num(s[f'median_{m}_ms']['median'])}/{fmt_num(s[f'p99_{m}_ms']['median'])} ms"
                        for m in ("ttft", "tpot", "itl", "e2el"))
        good = (f"  goodput {fmt_num(s['request_goodput']['median'])} req/s"
                if "request_goodput" in s else "")
        tp = {k: s["output_throughput"][k] for k in ("median", "ci_low", "ci_high", "n")}
        failed = sum(run["failed"] for run in r["runs"])
        lines.append(f"C={c:<4} {fmt_tok_s(tp | {'samples_step_s': []})}  "
                     f"{fmt_num(s['request_throughput']['median'])} req/s{good}"
                     + (f"  {failed} requests FAILED (first: {_first_error(r['runs'])})" if failed else ""))
        lines.append(f"       median/p99  {lat}")
    if objective != "output_throughput":
        for r in doc["results"]:
            v = r["summary"].get(objective)
            lines.append(f"objective {objective} at C={r['max_concurrency']}: "
                         f"{fmt_num(v['median']) if v else '-'}")
    return "\n".join(lines)


def _check_choices(url: str, api: str, fixed_length: str) -> None:
    from autoopt.errors import UserError
    from autoopt.targets.server.http_stream import Endpoint

    if api not in ("completions", "chat"):
        raise UserError(f"--api: expected completions or chat; got {api!r}")
    if fixed_length not in ("auto", "on", "off"):
        raise UserError(f"--fixed-length: expected auto, on or off; got {fixed_length!r}")
    try:
        Endpoint.parse(url)
    except ValueError as exc:
        raise UserError(f"URL: {exc}") from None


def _first_error(runs: list[dict[str, Any]]) -> str:
    return next((e for run in runs for e in run["errors"] if e), "")


@app.command("bench-serve")
def bench_serve(
    url: str = typer.Argument(..., help="The server's base URL, e.g. http://127.0.0.1:8000"),
    concurrency: str = typer.Option("1,4", "--concurrency", "-c", help="Concurrencies to sweep, comma-separated."),
    prompt_tokens: int = typer.Option(128, "--prompt-tokens", min=1, help="Prompt length in tokens (calibrated "
                                      "on the server's usage counts)."),
    output_tokens: int = typer.Option(128, "--output-tokens", min=1, help="Output tokens per request (max_tokens; "
                                      "ignore_eos/min_tokens too where the server takes them)."),
    requests: int = typer.Option(16, "--requests", "-n", min=1, help="Requests per concurrency and repeat "
                                 "(at least the concurrency)."),
    repeats: int = typer.Option(3, "--repeats", "-r", min=1, help="Runs per concurrency: the CI is over them."),
    slo: Optional[str] = typer.Option(None, "--slo", help="Goodput SLOs, e.g. ttft_ms<=500,tpot_ms<=50."),
    api: str = typer.Option("completions", "--api", help="completions or chat."),
    model: Optional[str] = typer.Option(None, "--model", help="The model field of requests (default: the first "
                                        "of /v1/models)."),
    objective: str = typer.Option("output_throughput", "--objective", help="The figure to report as the "
                                  "objective (output_throughput, request_goodput, p99_tpot_ms, ...)."),
    fixed_length: str = typer.Option("auto", "--fixed-length", help="auto|on|off: send ignore_eos/min_tokens."),
    timeout: float = typer.Option(1800.0, "--timeout", min=1, help="Seconds for the whole sweep."),
    as_json: bool = typer.Option(False, "--json", help="Print the result document as JSON."),
    save_result: Optional[Path] = typer.Option(None, "--save-result", help="Write the result JSON to FILE "
                                               "(vllm bench serve's field names, one entry per run)."),
) -> None:
    """Sweep a running OpenAI-compatible server (vLLM, SGLang, transformers serve, ...) over
    concurrencies: output tok/s with a 95% CI over repeats, req/s, TTFT, TPOT, ITL and end-to-end
    latency (median and p99), goodput under --slo.

    Examples:

      autoopt bench-serve http://127.0.0.1:8000 --concurrency 1,4,16 --repeats 3

      autoopt bench-serve http://127.0.0.1:8000 -c 8 --slo ttft_ms<=500,tpot_ms<=50 --save-result r.json
    """
    from autoopt.errors import UserError
    from autoopt.targets.server.loadgen import Workload, sweep
    from autoopt.targets.server.metrics import check_objective, parse_slos

    conc = _concurrency(concurrency)
    check_objective(objective)
    _check_choices(url, api, fixed_length)
    workload = Workload(model=model or _served_model(url), api=api, prompt_tokens=prompt_tokens,
                        output_tokens=output_tokens, requests=requests, repeats=repeats,
                        fixed_length=fixed_length, slos=parse_slos(slo))
    try:
        doc = sweep(url, workload, conc, timeout_s=timeout)
    except TimeoutError as exc:
        raise UserError(f"{url}: {exc} (--timeout)") from None
    except (ConnectionError, OSError) as exc:
        raise UserError(f"{url}: {exc}") from None
    doc["objective"] = objective
    if save_result is not None:
        save_result.write_text(json.dumps(doc, indent=1) + "\n")
    typer.echo(json.dumps(doc, indent=1) if as_json else _render(doc, objective))
