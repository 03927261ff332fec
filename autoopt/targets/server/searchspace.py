"""The SearchSpace of a server space file, validated against the ServerTarget's declarations.

The space file's `server:` block is the target's (autoopt.targets.server.spec); the rest is an
ordinary space file. Until the space loader knows the `server` key, the block is left out of the
mapping it reads: the same lines (errors keep their file:line), the same bytes and sha256.
"""
from __future__ import annotations

from typing import Any

from autoopt.space.document import LineMap, SpaceDocument


def without_server_block(doc: SpaceDocument) -> SpaceDocument:
    data = LineMap()
    data.line = doc.data.line
    for key, value in doc.data.items():
        if key != "server":
            data[key] = value
            data.lines[key] = doc.data.lines.get(key, doc.data.line)
    return SpaceDocument(path=doc.path, raw=doc.raw, data=data)


def declared(doc: SpaceDocument) -> Any:
    """The TargetInfo of a server space read from the file alone (nothing started): what
    autoopt.targets.declared.DECLARATIONS["server"] can return for `autoopt spaces`."""
    from autoopt.space.knobs import TargetInfo
    from autoopt.targets.server import spec as server_spec
    from autoopt.targets.server.target import ServerTarget

    target = ServerTarget(server_spec.read(doc), run_dir=None)
    try:
        return TargetInfo.from_target(target)
    finally:
        target.close()


def server_space(target: Any) -> Any:
    """SearchSpace over the target's space file (autoopt.space.space, TargetInfo from the target)."""
    from autoopt.space.knobs import TargetInfo
    from autoopt.space.space import SearchSpace

    doc = without_server_block(SpaceDocument.read(target.spec.path))
    return SearchSpace(doc, TargetInfo.from_target(target))
