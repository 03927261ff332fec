"""autoopt spaces: list the search spaces and their knobs (values, scope, restart class, buckets,
values excluded on the space's device with the reason). Reads YAML only: no torch, no worker.
"""
from __future__ import annotations

import json
from typing import Any, Optional

import typer

from autoopt.cli.app import app
from autoopt.errors import UserError

EPILOG = ("Spaces are looked up in ./search_spaces, the source tree's search_spaces/ and the copies "
          "packaged with autoopt. Exclusions are those of the space's device as declared (cpu: every "
          "value that needs CUDA, FP8 or Triton); on a GPU the live target decides when `autoopt run` "
          "starts. Exit codes: 0 = listed; 2 = the named space does not exist or is invalid "
          "(file:line: key: what was expected).")


@app.command("spaces", epilog=EPILOG)
def spaces(
    name: Optional[str] = typer.Argument(None, help="Show only this space (name or YAML file); "
                                         "validates it."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """List search spaces and their knobs.

    Examples:

      autoopt spaces

      autoopt spaces dsv4_flash_decode --json
    """
    from autoopt.space.document import list_space_files
    from autoopt.targets.declared import load_declared

    entries: list[dict[str, Any]] = []
    if name is not None:
        entries.append(load_declared(name).to_dict())  # SpaceError -> exit 2
    else:
        for path in list_space_files():
            try:
                entries.append(load_declared(path).to_dict())
            except UserError as exc:
                entries.append({"name": path.stem, "path": str(path), "error": str(exc)})
    if as_json:
        print(json.dumps({"spaces": entries}, indent=2, default=str))
        return
    _render(entries)


def _render(entries: list[dict[str, Any]]) -> None:
    """Plain lines (narrow terminals and pipes read them better than a wide table)."""
    from rich.console import Console
    from rich.markup import escape

    out = Console(highlight=False, soft_wrap=True)
    if not entries:
        out.print("no search spaces found (looked in ./search_spaces and the packaged copies)")
        return
    for e in entries:
        if "error" in e:
            out.print(f"[bold]{e['name']}[/bold]  [red]invalid: {escape(e['error'])}[/red]\n")
            continue
        out.print(f"[bold]{e['name']}[/bold]  {e['path']}")
        if e["description"]:
            out.print(f"  {escape(e['description'])}")
        out.print(f"  target {e['target']}, preset {e['preset']}, device {e['device']}; "
                  f"objective {e['objective']['text']}; concurrency {e['concurrency']}")
        out.print(f"  {len(e['params'])} parameters, {e['size']:,} points before constraints "
                  f"(baseline value marked *)")
        for k in e["knobs"]:
            values = ", ".join(f"{v}*" if v == k["baseline"] else str(v) for v in k["values"])
            where = ", ".join(str(w) for w in k["where"])
            scope = k["scope"] + (f" [{where}]" if where else "")
            out.print(f"  [cyan]{k['name']:<20}[/cyan] {escape(values):<34} {escape(scope):<28} "
                      f"restart {k['restart_class']:<9} buckets {', '.join(k['buckets'])}")
            for v, reason in k["excluded"].items():
                out.print(f"  {'':<20} [yellow]excluded {v}: {escape(reason)}[/yellow]")
        for kname, reason in e["excluded_knobs"].items():
            out.print(f"  [dim]{kname:<20} dropped: {escape(reason)}[/dim]")
        for c in e["constraints"]:
            out.print(f"  constraint: {escape(c)}")
        out.print()
