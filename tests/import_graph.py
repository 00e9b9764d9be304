"""The import graph of `pipo_jax/`, `configs/` and `experiments/`, read with `ast` (nothing is executed), and
ARCHITECTURE.md's table of it: which package imports which.

    python -m tests.import_graph           # rewrite the table between ARCHITECTURE.md's markers
    python -m tests.import_graph --check   # exit 1 if the committed table differs from the code's

`tests/test_layers.py` checks the graph's rules, `tests/test_docs.py` that the committed table is the code's.
"""

from __future__ import annotations

import ast
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("pipo_jax", "configs", "experiments")
ARCHITECTURE = ROOT / "ARCHITECTURE.md"
TABLE_BEGIN, TABLE_END = "<!-- imports:begin (python -m tests.import_graph) -->", "<!-- imports:end -->"
REGENERATE = "python -m tests.import_graph"


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def is_package_module(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


def resolve(name: str) -> str:
    """The module `name` refers to: itself if it is one, else its longest module prefix
    (`from pipo_jax.models.qwen3 import forward` -> `pipo_jax.models.qwen3`)."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def file_imports(path: pathlib.Path, where: str | None = None) -> list[tuple[str, int, bool]]:
    """(imported module, line, function-level) of every import statement of the file at `path` (`where`
    names it in the error about a relative import)."""
    where = where or str(path)
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend((a.name, child.lineno, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                assert child.level == 0, f"{where}:{child.lineno}: relative import"
                base = child.module or ""
                for a in child.names:
                    # `from pkg import sub` names the submodule `pkg.sub` when there is one.
                    full = f"{base}.{a.name}"
                    out.append((full if full in MODULES else base, child.lineno, in_function))
            visit(child, nested)

    visit(tree, False)
    return out


def imports(module: str) -> list[tuple[str, int, bool]]:
    """(imported module, line, function-level) of every import statement in `module`."""
    return file_imports(MODULES[module], module)


IMPORTS = {m: imports(m) for m in MODULES}


def dynamic_imports(module: str) -> list[tuple[str, int]]:
    """(module, line) of every `importlib.import_module("<a literal name>")` call in `module`: an import no
    import statement shows (`tasks/code/child.py` starts the judge so), an edge of the graph all the same."""
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    return [(resolve(node.args[0].value), node.lineno) for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "importlib"
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)]


DYNAMIC_IMPORTS = {m: dynamic_imports(m) for m in MODULES}


def package_edges(function_level: bool | None = None) -> list[tuple[str, str, int]]:
    """(importing module, imported package module, line) of every import of the package's own modules;
    `function_level=None`: every one, the `importlib.import_module` calls of a literal name included."""
    edges = [(m, resolve(name), line) for m, imps in IMPORTS.items() for name, line, fn in imps
             if is_package_module(name) and (function_level is None or fn == function_level)]
    if function_level is None:
        edges += [(m, name, line) for m, imps in DYNAMIC_IMPORTS.items() for name, line in imps
                  if is_package_module(name)]
    return edges


def package_of(module: str) -> str:
    """The unit of ARCHITECTURE.md's table: `pipo_jax.<sub>` -> `<sub>` (a subpackage, or a module such as
    `platforms`), `pipo_jax` for the package's `__init__`, `configs` / `experiments` for theirs."""
    parts = module.split(".")
    return parts[1] if parts[0] == "pipo_jax" and len(parts) > 1 else parts[0]


def package_graph() -> dict[str, set[str]]:
    """Package -> the other packages its modules import (module- and function-level)."""
    graph: dict[str, set[str]] = {package_of(m): set() for m in MODULES}
    for m, target, _ in package_edges():
        if package_of(target) != package_of(m):
            graph[package_of(m)].add(package_of(target))
    return graph


def _depths(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each package's longest import chain down to a package importing none (0); raises on a cycle."""
    depth: dict[str, int] = {}

    def visit(p: str, path: tuple[str, ...]) -> int:
        if p in path:
            raise ValueError(f"packages import each other: {' -> '.join(path[path.index(p):] + (p,))}")
        if p not in depth:
            depth[p] = 1 + max((visit(q, path + (p,)) for q in graph[p]), default=-1)
        return depth[p]

    for p in graph:
        visit(p, ())
    return depth


WIDTH = 120  # ARCHITECTURE.md's columns


def import_table() -> str:
    """`package_graph()` as a fenced block, one `package -> imported packages` line each (wrapped at `WIDTH`),
    packages lowest first: by the longest chain of imports below each, then by name."""
    graph = package_graph()
    depth = _depths(graph)
    rows = sorted(graph, key=lambda p: (depth[p], p))
    pad = max(map(len, rows))
    lines = ["```"]
    for p in rows:
        targets = [q + "," for q in sorted(graph[p], key=lambda q: (depth[q], q))] or ["(none),"]
        targets[-1] = targets[-1][:-1]
        line = f"{p:<{pad}} ->"
        for word in targets:
            if len(line) + 1 + len(word) > WIDTH:
                lines.append(line)
                line = " " * (pad + 3)
            line += " " + word
        lines.append(line)
    return "\n".join(lines + ["```"])


def _block_span(text: str) -> tuple[int, int]:
    i, j = text.find(TABLE_BEGIN), text.find(TABLE_END)
    if i < 0 or j < i:
        raise SystemExit(f"{ARCHITECTURE.name}: no {TABLE_BEGIN} ... {TABLE_END} block")
    return i + len(TABLE_BEGIN), j


def committed_table(text: str) -> str:
    i, j = _block_span(text)
    return text[i:j].strip("\n")


def with_table(text: str, table: str) -> str:
    i, j = _block_span(text)
    return text[:i] + "\n" + table + "\n" + text[j:]


def main(argv: list[str]) -> int:
    text = ARCHITECTURE.read_text()
    table = import_table()
    if "--check" in argv[1:]:
        same = committed_table(text) == table
        print(f"{ARCHITECTURE.name}: the import table " + ("is the code's" if same else f"differs; run `{REGENERATE}`"))
        return 0 if same else 1
    new = with_table(text, table)
    if new != text:
        ARCHITECTURE.write_text(new)
    print(f"{ARCHITECTURE.name}: import table " + ("rewritten" if new != text else "unchanged"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
