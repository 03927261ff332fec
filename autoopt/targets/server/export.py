"""`autoopt best --export FILE.yaml` for a server study: the winning launch recipe.

The export is a YAML that says what it is (`kind: server launch`): the command line to paste, its
argv, the environment autoopt adds, the fields every request must carry (the hot knobs), the
config file's contents when knobs render into one (also written beside the export as
server_config.<format>, the path the argv names), then the knobs, the space, the environment the
trial was measured in and the evidence (tok/s per C with CI, speed-up over the baseline), as for the
builtin target, and the warnings `best` gave (a confirmation that disagrees). The recipe is rendered
from the run's space file, which must still exist; when it changed since the run, the export says so
(`space.changed_since_run: true`).
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml

from autoopt.errors import UserError

EXPORT_VERSION = 1
KIND = "server launch"


def space_path_of(run: Any) -> Path | None:
    """The space file of a server run (its target spec server:FILE, else its settings' space_path)."""
    if run is None:
        return None
    target = str(run.target or "")
    if target.startswith("server:"):
        return Path(target[len("server:"):])
    path = (run.settings or {}).get("space_path")
    return Path(path) if path else None


def is_server_run(run: Any) -> bool:
    return run is not None and str(run.target or "").startswith("server")


def server_export(doc: dict[str, Any], run: Any, export_path: Path) -> dict[str, Any]:
    """The export document of `doc` (autoopt.store.export.build_export's) with the launch recipe."""
    from autoopt.targets.server import spec as server_spec
    from autoopt.targets.server.target import ServerTarget

    space = space_path_of(run)
    if space is None or not space.is_file():
        raise UserError(f"cannot export the server launch of study {doc['evidence']['study']!r}: its space "
                        f"file {str(space) if space else '(none recorded)'} is gone; the recipe is rendered "
                        f"from its server: block")
    recipe = ServerTarget(server_spec.read(space)).launch_recipe(doc["knobs"], config_dir=export_path.parent)
    changed = hashlib.sha256(space.read_bytes()).hexdigest() != (doc.get("space") or {}).get("sha256")
    server = {"command_line": recipe["command_line"], "argv": recipe["argv"], "env": recipe["env"],
              "request_fields": recipe["request_fields"], "base_url": recipe["base_url"],
              "model": recipe["model"], "config_path": recipe["config_path"],
              "config_file": recipe["config_file"]}
    return {"autoopt_export": EXPORT_VERSION, "kind": KIND, "target": doc.get("target"), "server": server,
            "knobs": doc["knobs"], "space": dict(doc.get("space") or {}) | {"path": str(space),
                                                                            "changed_since_run": changed},
            "environment": doc.get("environment", {}), "evidence": doc.get("evidence", {}),
            "warnings": list(doc.get("warnings") or []), "autoopt_version": doc.get("autoopt_version")}


def write_server_export(path: str | Path, doc: dict[str, Any], run: Any) -> Path:
    """Write the export (and the config file beside it when there is one). UserError when the path is
    a directory, its directory does not exist or a write fails."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"cannot write {path}: it is a directory (give a file name, e.g. {path / 'server.yaml'})")
    if not path.parent.is_dir():
        raise UserError(f"cannot write {path}: directory {path.parent} does not exist")
    out = server_export(doc, run, path)
    server = out["server"]
    try:
        if server["config_path"] is not None:
            text = (_json(server["config_file"]) if server["config_path"].endswith(".json")
                    else yaml.safe_dump(server["config_file"], sort_keys=True))
            Path(server["config_path"]).write_text(text)
        path.write_text(yaml.safe_dump(_plain(out), sort_keys=False, default_flow_style=False))
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


def _json(value: Any) -> str:
    import json

    return json.dumps(value, indent=1, sort_keys=True) + "\n"


def _plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {(k if isinstance(k, (str, int, float, bool)) else str(k)): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj
