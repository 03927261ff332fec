"""Reading a search-space file: where spaces live, YAML with line numbers, one-line errors.

Every mapping and sequence read from the file remembers the line of each key/item, so a validation
error can say `search_spaces/x.yaml:14: knobs.mhc_gemm.scope: expected ...`. YAML 1.1 would read
`on`/`off`/`yes`/`no` as booleans (and `cuda_graphs: [off, on]` as [False, True]); here only
true/false are booleans, everything else stays text.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from autoopt.errors import SpaceError

SPACE_SUFFIXES = (".yaml", ".yml")


class LineMap(dict):
    """A mapping read from YAML; `line` is where it starts, `lines[key]` where each key is."""

    def __init__(self) -> None:
        super().__init__()
        self.line = 0
        self.lines: dict[Any, int] = {}


class LineSeq(list):
    """A sequence read from YAML; `line` is where it starts, `lines[i]` where each item is."""

    def __init__(self) -> None:
        super().__init__()
        self.line = 0
        self.lines: list[int] = []


class _DuplicateKey(Exception):
    def __init__(self, key: Any, line: int) -> None:
        super().__init__(key, line)
        self.key, self.line = key, line


class _LineLoader(yaml.SafeLoader):
    pass


_BOOL_TAG = "tag:yaml.org,2002:bool"
_LineLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != _BOOL_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_LineLoader.add_implicit_resolver(_BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                  list("tTfF"))


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> LineMap:
    loader.flatten_mapping(node)
    out = LineMap()
    out.line = node.start_mark.line + 1
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in out:
            raise _DuplicateKey(key, line)
        out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = line
    return out


def _construct_sequence(loader: _LineLoader, node: yaml.SequenceNode) -> LineSeq:
    out = LineSeq()
    out.line = node.start_mark.line + 1
    for item in node.value:
        out.append(loader.construct_object(item, deep=True))
        out.lines.append(item.start_mark.line + 1)
    return out


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def line_of(container: Any, key: Any = None) -> int:
    """The line of `container[key]` (or of the container itself); 0 when unknown."""
    if isinstance(container, LineMap):
        return container.lines.get(key, container.line) if key is not None else container.line
    if isinstance(container, LineSeq):
        if isinstance(key, int) and 0 <= key < len(container.lines):
            return container.lines[key]
        return container.line
    return 0


def search_dirs() -> list[Path]:
    """Where named spaces are looked up, first match wins: ./search_spaces, the source tree's
    search_spaces/, then the copies packaged inside autoopt (autoopt/data)."""
    package = Path(__file__).resolve().parents[1]  # autoopt/
    dirs = [Path.cwd() / "search_spaces", package.parent / "search_spaces", package / "data"]
    out: list[Path] = []
    for d in dirs:
        d = d.resolve()
        if d not in out:
            out.append(d)
    return out


def list_space_files() -> list[Path]:
    """Every space file, one per name (the first directory in `search_dirs()` wins)."""
    seen: dict[str, Path] = {}
    for d in search_dirs():
        if not d.is_dir():
            continue
        for p in sorted(d.iterdir()):
            if p.suffix in SPACE_SUFFIXES and p.stem not in seen and p.is_file():
                seen[p.stem] = p
    return [seen[k] for k in sorted(seen)]


def find_space(name_or_path: str | Path) -> Path:
    """A path to an existing file, or a space name looked up in `search_dirs()`."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    if p.suffix not in SPACE_SUFFIXES and p.parent == Path("."):
        for d in search_dirs():
            for suffix in SPACE_SUFFIXES:
                cand = d / f"{p.name}{suffix}"
                if cand.is_file():
                    return cand
    names = ", ".join(f.stem for f in list_space_files()) or "none found"
    raise SpaceError(f"{name_or_path}: no such space file or space name (known spaces: {names})")


@dataclass
class SpaceDocument:
    """The raw file: path, bytes, sha256 and the parsed top-level mapping (with line numbers)."""

    path: Path
    raw: bytes
    data: LineMap

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.raw).hexdigest()

    @property
    def display_path(self) -> str:
        try:
            return str(self.path.resolve().relative_to(Path.cwd()))
        except ValueError:
            return str(self.path)

    @classmethod
    def read(cls, name_or_path: str | Path) -> "SpaceDocument":
        path = find_space(name_or_path)
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise SpaceError(f"{path}: cannot read the space file ({exc.strerror})") from None
        try:
            data = yaml.load(raw.decode("utf-8"), Loader=_LineLoader)  # noqa: S506 (safe subclass)
        except _DuplicateKey as exc:
            raise SpaceError(f"{path}:{exc.line}: duplicate key {exc.key!r}") from None
        except UnicodeDecodeError:
            raise SpaceError(f"{path}: not UTF-8 text") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise SpaceError(f"{where}: invalid YAML ({problem})") from None
        if not isinstance(data, LineMap):
            raise SpaceError(f"{path}:1: expected a mapping with name, target, preset, knobs, ...; "
                             f"got {type(data).__name__}")
        return cls(path=path, raw=raw, data=data)

    def error(self, container: Any, key: Any, key_path: str, expected: str) -> SpaceError:
        """A one-line SpaceError: file:line: key.path: what was expected (and what was found)."""
        return SpaceError(f"{self.display_path}:{line_of(container, key)}: {key_path}: {expected}")

    def header(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)
