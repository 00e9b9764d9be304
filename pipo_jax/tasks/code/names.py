"""Whose each name of an assert test is: the judge's (builtins, standard-library modules used as
modules, what the tests bind or import themselves) or the solution's (the rest). A name of the
solution's that the test applies to a value of the solution's (``isclose(area(2), 12.566)``
without ``from math import isclose``) would let the solution judge its own answer: such a
"helper" must be imported by the test. So would a constant of the solution's (a name no test
calls) that a comparison or a judge's function weighs the solution's values with (``abs(area(2) -
12.566) < EPS``: the solution sets ``EPS = 1e9``); the test must write the value itself. So would
a name of the solution's that makes the other side of a comparison (``area(2) == approx(12.566)``,
``== sqrt(25)``, ``== Counter({...})``: the solution's ``approx`` returns what its ``area`` does);
the test must import it. Standard library only (the judge imports it)."""
from __future__ import annotations

import ast
import builtins
import sys


def unimported_helpers(sources: list[str]) -> list[tuple[int, str]]:
    """(test index, name) of each name of the solution's that a test of the row judges the
    solution's values with: a function it applies to them (another name of the solution's, or a
    variable the tests computed from one), a constant (a name no test calls, or a variable
    computed from one) in a comparison or a judge's call beside them, or a name that makes the
    other side of a comparison (`_expected_side`)."""
    trees = {k: tree for k, source in enumerate(sources) if (tree := _parse(source)) is not None}
    bound = set().union(*(_bound(t) for t in trees.values()))
    solution = set().union(*(_loaded(t) for t in trees.values())) - bound - set(dir(builtins))
    solution -= set().union(*(_modules(t) for t in trees.values()))
    tainted = _tainted(list(trees.values()), solution)
    constants = solution - set().union(*(_called(t) for t in trees.values()))
    weights = constants | _tainted(list(trees.values()), constants)
    values = (solution - constants) | _tainted(list(trees.values()), solution - constants)
    roots = _roots(list(trees.values()), solution)
    out = []
    for k, tree in trees.items():
        names = _helpers(tree, solution, tainted) | _judging_constants(tree, solution, weights, values)
        names |= _expected_side(tree, solution, roots)
        out += [(k, name) for name in sorted(names)]
    return out


def unimported_message(k: int, name: str) -> str:
    return (f"test {k + 1} judges the solution's results with {name!r}, which it neither imports nor defines, so "
            f"the solution's own {name!r} would judge its answer: import it in the test (e.g. 'from math import "
            f"{name}') or write its value in the test")


def _parse(source: str) -> ast.AST | None:
    try:
        return ast.parse(source)
    except SyntaxError:
        return None


def _bound(tree: ast.AST) -> set[str]:
    """Names the test binds: assignments, loop and comprehension targets, imports, defs, arguments."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            out.add(node.name)
    return out


def _loaded(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _modules(tree: ast.AST) -> set[str]:
    """Standard-library module names used as modules (``math.isclose``): the judge's."""
    return {n.value.id for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id in sys.stdlib_module_names}


def _assignments(tree: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
    """(target, value) of each binding from a value: =, +=, annotated, for, comprehension, with, :=."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            out += [(t, node.value) for t in node.targets]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            out.append((node.target, node.value))
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            out.append((node.target, node.iter))
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            out.append((node.optional_vars, node.context_expr))
    return out


def _tainted(trees: list[ast.AST], solution: set[str]) -> set[str]:
    """Variables of the tests that hold (something computed from) the solution's values."""
    pairs = [pair for tree in trees for pair in _assignments(tree)]
    tainted: set[str] = set()
    while True:
        more = {name for target, value in pairs if _loaded(value) & (solution | tainted)
                for name in _loaded_or_stored(target)} - tainted
        if not more:
            return tainted
        tainted |= more


def _roots(trees: list[ast.AST], solution: set[str]) -> dict[str, set[str]]:
    """Per variable of the tests: the names of the solution's its value is computed from."""
    pairs = [pair for tree in trees for pair in _assignments(tree)]
    roots: dict[str, set[str]] = {}
    while True:
        grew = False
        for target, value in pairs:
            names = _loaded(value)
            found = (names & solution).union(*(roots.get(n, set()) for n in names))
            for name in _loaded_or_stored(target) if found else ():
                if not found <= roots.setdefault(name, set()):
                    roots[name] |= found
                    grew = True
        if not grew:
            return roots


def _expected_side(tree: ast.AST, solution: set[str], roots: dict[str, set[str]]) -> set[str]:
    """Names of the solution's on the expected side: where a comparison, arithmetic, or a call
    not of the solution's takes two operands that both hold the solution's values, the
    solution's names in a later operand that the first does not hold (``area(2) ==
    approx(12.566)``: the solution's ``approx`` would make the expected value, whatever its
    ``area`` returns)."""
    def origin(node: ast.AST) -> set[str]:
        names = _loaded(node)
        return (names & solution).union(*(roots.get(n, set()) for n in names))

    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.BinOp):
            operands = [node.left, node.right]
        elif isinstance(node, ast.Call) and not origin(node.func):
            operands = [*node.args, *(k.value for k in node.keywords)]
        else:
            continue
        held = [names for names in map(origin, operands) if names]
        if len(held) > 1:
            out |= set().union(*held[1:]) - held[0]
    return out


def _loaded_or_stored(target: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def _called(tree: ast.AST) -> set[str]:
    """Names the test calls (``f(...)``)."""
    return {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def _judging_constants(tree: ast.AST, solution: set[str], weights: set[str], values: set[str]) -> set[str]:
    """Names of `weights` (the solution's constants, and variables computed from them) that a
    comparison, or a call of a function not the solution's, takes beside `values` (the solution's
    functions' results)."""
    out = set()
    for node in ast.walk(tree):
        judged = isinstance(node, ast.Compare) or (
            isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in solution))
        if judged and (names := _loaded(node)) & values:
            out |= names & weights
    return out


def _helpers(tree: ast.AST, solution: set[str], tainted: set[str]) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in solution:
            inputs = set().union(*(_loaded(a) for a in node.args), *(_loaded(k.value) for k in node.keywords))
            if inputs & ((solution - {node.func.id}) | tainted):
                out.add(node.func.id)
    return out
