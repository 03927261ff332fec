"""A space validated against its target's declarations, without starting the target: what `autoopt
spaces`, the tests and the benchmarks load. A run validates against the live target instead
(`TargetInfo.from_target`), which knows what the device in front of it can run."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from autoopt.space.document import SpaceDocument
from autoopt.space.knobs import TargetInfo
from autoopt.space.space import SearchSpace


def _builtin(doc: SpaceDocument) -> TargetInfo:
    from autoopt.targets.builtin.declared import builtin_info

    try:
        return builtin_info(str(doc.header("preset", "tiny")), str(doc.header("device", "cpu")),
                            doc.header("shape_overrides") or {})
    except ValueError as exc:
        raise doc.error(doc.data, "preset", "preset", str(exc)) from None


def _server(doc: SpaceDocument) -> TargetInfo:
    from autoopt.targets.server.searchspace import declared

    return declared(doc)  # the server: block read, nothing started


# target name in a space file's header -> its declarations read from the document alone
DECLARATIONS: dict[str, Callable[[SpaceDocument], TargetInfo]] = {"builtin": _builtin, "server": _server}


def declared_info(doc: SpaceDocument) -> TargetInfo:
    target = str(doc.header("target", "builtin"))
    if target not in DECLARATIONS:
        raise doc.error(doc.data, "target", "target",
                        f"expected one of: {', '.join(DECLARATIONS)} (targets whose knobs are known "
                        f"without starting them); got {target!r}")
    return DECLARATIONS[target](doc)


def load_declared(name_or_path: str | Path) -> SearchSpace:
    """Read a space file (a name under search_spaces/ or a path) and validate it against its target's
    declarations. SpaceError (exit 2, file:line) on anything invalid."""
    doc = SpaceDocument.read(name_or_path)
    info = declared_info(doc)
    if str(doc.header("target", "builtin")) == "server":
        from autoopt.targets.server.searchspace import without_server_block

        doc = without_server_block(doc)  # the target's block; the rest is an ordinary space file
    return SearchSpace(doc, info)
