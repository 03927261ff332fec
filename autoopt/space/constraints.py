"""Constraints between knobs, written as small Python-like expressions and never `eval`'d.

    mhc_operand == 'cast_from_fp32' or mhc_gemm == 'bf16'
    not (attention == 'per_head' and attn_split_k > 1)
    indexer_gemm in ('fp32', 'bf16')

Names are knob names (`mhc_gemm`: the value in effect on the layer being checked) or parameter names
with a scope (`mhc_gemm@c4`, `attention@L3`: that one parameter's value, the same on every layer):

    mhc_gemm@c4 == 'bf16' or indexer_gemm == 'fp32'

`@` is not part of a Python name, so before parsing, a NAME `@` NAME run outside string literals
(found with `tokenize`) becomes one identifier; nothing else is rewritten.

The text is parsed with `ast` and every node is checked against a whitelist: names (knob names),
constants (str / int / float / bool / None), tuples and lists of constants, `==  !=  <  <=  >  >=  in
not in` (chained comparisons too), `and`, `or`, `not`. Anything else (calls, attributes, subscripts,
arithmetic, lambdas, comprehensions) is rejected at load time with the reason. Evaluation walks the
checked tree with a tiny interpreter over a {knob: value} environment.

A constraint holds for a configuration when it holds on every layer with the knob values in effect
there (see `autoopt.space.space.SearchSpace.violations`).
"""
from __future__ import annotations

import ast
import io
import operator
import tokenize
from dataclasses import dataclass
from typing import Any, Callable, Mapping

_COMPARE: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_CONSTANT_TYPES = (str, int, float, bool, type(None))
_AT = "__at__"  # what `@` in a parameter name becomes for ast (names carry it back as `@`)


def _join_scoped_names(text: str) -> str:
    """'mhc_gemm@c4 == "x@y"' -> 'mhc_gemm__at__c4 == "x@y"': NAME @ NAME runs become one name."""
    if "@" not in text:
        return text
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return text  # ast.parse reports the syntax error
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    offset = lambda pos: starts[pos[0] - 1] + pos[1]  # noqa: E731
    out, last, i = [], 0, 0
    while i < len(toks):
        tok = toks[i]
        if (tok.type == tokenize.NAME and i + 2 < len(toks) and toks[i + 1].type == tokenize.OP
                and toks[i + 1].string == "@" and toks[i + 2].type in (tokenize.NAME, tokenize.NUMBER)):
            j = i
            parts = [tok.string]
            while (j + 2 < len(toks) and toks[j + 1].type == tokenize.OP and toks[j + 1].string == "@"
                   and toks[j + 2].type in (tokenize.NAME, tokenize.NUMBER)):
                parts.append(toks[j + 2].string)
                j += 2
            out.append(text[last:offset(tok.start)])
            out.append(_AT.join(parts))
            last = offset(toks[j].end)
            i = j + 1
            continue
        i += 1
    out.append(text[last:])
    return "".join(out)


def _name(identifier: str) -> str:
    return identifier.replace(_AT, "@")


class ConstraintSyntaxError(ValueError):
    """The expression uses something outside the whitelist; the message says what."""


@dataclass(frozen=True)
class Constraint:
    """A checked constraint expression. `names` are the knob names it reads."""

    text: str
    names: frozenset[str]
    _tree: ast.Expression

    def holds(self, env: Mapping[str, Any]) -> bool:
        """True when the expression is truthy with knob values `env` (every name must be present)."""
        return bool(_eval(self._tree.body, env))

    def __str__(self) -> str:
        return self.text

    def compared_values(self) -> list[tuple[str, Any]]:
        """(name, value) for every `name == value`, `name != value` and `name in (values...)` in the
        expression (either side): the values a name is tested against, to be checked against what
        the knob can take (a misspelt value would make the test silently always false or true)."""
        out: list[tuple[str, Any]] = []
        for node in ast.walk(self._tree):
            if not isinstance(node, ast.Compare):
                continue
            operands = [node.left, *node.comparators]
            for op, a, b in zip(node.ops, operands, operands[1:]):
                if not isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
                    continue
                for name_node, other in ((a, b), (b, a)):
                    if isinstance(name_node, ast.Name):
                        out += [(_name(name_node.id), v) for v in _literal_values(other, op)]
        return out


def parse_constraint(text: str, known_names: set[str] | None = None) -> Constraint:
    """Parse and check `text`. Raises ConstraintSyntaxError naming the offending part.

    `known_names`: when given, every name in the expression must be one of them (a typo in a knob
    name would otherwise make the constraint silently always false).
    """
    if not isinstance(text, str) or not text.strip():
        raise ConstraintSyntaxError("a constraint must be a non-empty expression string")
    try:
        tree = ast.parse(_join_scoped_names(text.strip()), mode="eval")
    except SyntaxError as exc:
        raise ConstraintSyntaxError(f"not a valid expression ({exc.msg}): {text!r}") from None
    names: set[str] = set()
    _check(tree.body, names)
    if known_names is not None:
        unknown = sorted(names - set(known_names))
        if unknown:
            raise ConstraintSyntaxError(
                f"unknown name(s) {', '.join(unknown)} in {text!r} "
                f"(expected knob names: {', '.join(sorted(known_names))})")
    return Constraint(text=text.strip(), names=frozenset(names), _tree=tree)


def _literal_values(node: ast.AST, op: ast.cmpop) -> list[Any]:
    """The constant(s) a comparison tests a name against (none when the other side is a name)."""
    if isinstance(op, (ast.In, ast.NotIn)) and isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [_eval(e, {}) for e in node.elts]
    if isinstance(node, ast.Constant) or (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)):
        return [_eval(node, {})]
    return []


def _describe(node: ast.AST) -> str:
    try:
        return f"{type(node).__name__} `{_name(ast.unparse(node))}`"
    except Exception:  # ast.unparse cannot fail on parsed trees; keep the message useful anyway
        return type(node).__name__


def _check(node: ast.AST, names: set[str]) -> None:
    """Reject every node outside the whitelist; collect the names read."""
    if isinstance(node, ast.BoolOp):
        if not isinstance(node.op, (ast.And, ast.Or)):
            raise ConstraintSyntaxError(f"operator not allowed: {_describe(node)}")
        for v in node.values:
            _check(v, names)
    elif isinstance(node, ast.UnaryOp):
        if not isinstance(node.op, (ast.Not, ast.USub)):
            raise ConstraintSyntaxError(f"operator not allowed: {_describe(node)}")
        if isinstance(node.op, ast.USub) and not isinstance(node.operand, ast.Constant):
            raise ConstraintSyntaxError(f"unary minus only on numbers: {_describe(node)}")
        _check(node.operand, names)
    elif isinstance(node, ast.Compare):
        for op in node.ops:
            if type(op) not in _COMPARE:
                raise ConstraintSyntaxError(f"comparison not allowed: {_describe(node)}")
        _check(node.left, names)
        for c in node.comparators:
            _check(c, names)
    elif isinstance(node, ast.Name):
        if not isinstance(node.ctx, ast.Load):
            raise ConstraintSyntaxError(f"assignment not allowed: {_describe(node)}")
        names.add(_name(node.id))
    elif isinstance(node, ast.Constant):
        if not isinstance(node.value, _CONSTANT_TYPES):
            raise ConstraintSyntaxError(f"constant type not allowed: {_describe(node)}")
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for elt in node.elts:
            if not isinstance(elt, ast.Constant) and not (
                    isinstance(elt, ast.UnaryOp) and isinstance(elt.op, ast.USub)):
                raise ConstraintSyntaxError(f"collections may hold constants only: {_describe(node)}")
            _check(elt, names)
    else:
        raise ConstraintSyntaxError(
            f"not allowed in a constraint: {_describe(node)} (allowed: knob names, parameter names "
            "such as knob@c4, constants, "
            "== != < <= > >= in, not in, and, or, not)")


def _eval(node: ast.AST, env: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            result: Any = True
            for v in node.values:
                result = _eval(v, env)
                if not result:
                    return result
            return result
        result = False
        for v in node.values:
            result = _eval(v, env)
            if result:
                return result
        return result
    if isinstance(node, ast.UnaryOp):
        value = _eval(node.operand, env)
        return (not value) if isinstance(node.op, ast.Not) else -value
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, comp in zip(node.ops, node.comparators):
            right = _eval(comp, env)
            try:
                ok = _COMPARE[type(op)](left, right)
            except TypeError:  # e.g. 'bf16' < 4: incomparable values do not satisfy an ordering
                ok = False
            if not ok:
                return False
            left = right
        return True
    if isinstance(node, ast.Name):
        name = _name(node.id)
        if name not in env:
            raise KeyError(f"constraint reads {name!r}, which has no value here")
        return env[name]
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Tuple):
        return tuple(_eval(e, env) for e in node.elts)
    if isinstance(node, ast.List):
        return [_eval(e, env) for e in node.elts]
    if isinstance(node, ast.Set):
        return {_eval(e, env) for e in node.elts}
    raise ConstraintSyntaxError(f"unchecked node {_describe(node)}")  # unreachable after _check
