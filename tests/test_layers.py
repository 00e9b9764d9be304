"""The import graph of `pipo_jax/`, `configs/` and `experiments/` points one way (ARCHITECTURE.md 1).

Layers, lowest first: models -> kernels -> losses -> sampling -> tasks -> rl -> run -> configs -> experiments.
A module imports only from its own layer or lower ones. `platforms.py`, `config/` (the config schema), `data/`
and `parallel/` are leaves anything may import; `config/` imports nothing of the package but `platforms`, and
`parallel/` nothing but `platforms` and `config/` (its typed sections).
No module cycles; no function-level imports except of the optional third-party packages below.
Imports are read with `ast` (module- and function-level), nothing is executed.
"""

import ast
import subprocess
import sys

import pytest

from tests.import_graph import IMPORTS, MODULES, ROOT
from tests.import_graph import imports as _imports
from tests.import_graph import package_edges as _package_edges

LAYERS = ("models", "kernels", "losses", "sampling", "tasks", "rl", "run", "configs", "experiments")
LEAVES = ("pipo_jax.platforms", "pipo_jax.provenance", "pipo_jax.config", "pipo_jax.native_banners", "pipo_jax.data",
          "pipo_jax.parallel")
LEARNER = ("rl", "losses", "models", "kernels", "sampling", "tasks", "run")  # what the config schema never imports

# Imported inside the function that needs them, so the package runs without them installed (or, for
# math-verify and the sympy / latex2sympy2 it brings, so only the verifier's worker processes pay their
# seconds-long import).
OPTIONAL_THIRD_PARTY = frozenset({"tunix", "pyarrow", "tensorflow_datasets", "transformers", "torch", "tensorboardX",
                                  "wandb", "matplotlib", "tqdm", "math_verify", "sympy", "latex2sympy2_extended",
                                  "tokenizers", "reasoning_gym"})


def _layer(module: str) -> int:
    """-1 for a leaf; else the index in LAYERS (configs and experiments are top-level packages)."""
    if any(module == leaf or module.startswith(leaf + ".") for leaf in LEAVES):
        return -1
    parts = module.split(".")
    if parts[0] == "pipo_jax":
        if len(parts) == 1:
            return -1  # the package's __init__ (a docstring and __version__)
        return LAYERS.index(parts[1])
    return LAYERS.index(parts[0])


def test_every_module_is_placed_in_a_layer():
    for module in MODULES:
        _layer(module)  # raises ValueError for a package outside LAYERS / LEAVES
    assert "pipo_jax.run.trainer" in MODULES and "experiments.train" in MODULES


def test_no_import_points_to_a_higher_layer():
    bad = [f"{m}:{line} imports {target}" for m, target, line in _package_edges()
           if _layer(target) > _layer(m)]
    assert not bad, "imports pointing up a layer:\n" + "\n".join(bad)


def test_leaves_import_only_leaves_and_parallel_only_platforms_and_the_config():
    bad = []
    for m, target, line in _package_edges():
        if m.startswith("pipo_jax.parallel"):
            if not target.startswith(("pipo_jax.parallel", "pipo_jax.config")) and target != "pipo_jax.platforms":
                bad.append(f"{m}:{line} imports {target}")
        elif m.startswith("pipo_jax.config"):
            if not target.startswith("pipo_jax.config") and target != "pipo_jax.platforms":
                bad.append(f"{m}:{line} imports {target}")
        elif _layer(m) == -1 and _layer(target) != -1:
            bad.append(f"{m}:{line} imports {target}")
    assert not bad, "leaf modules importing the package:\n" + "\n".join(bad)


# The config schema is on the ground floor: the learner's registries push their names and settings
# sections into it (`config/registry.py`); it imports none of them, read from the code and when imported.
_SCHEMA_PROBE = """
import sys
import pipo_jax.config.registry, pipo_jax.config.schema, pipo_jax.config.sections, pipo_jax.config.moves
print(sorted(m for m in sys.modules if m.split(".")[:2] in [["pipo_jax", p] for p in %r]))
""" % (LEARNER,)


def test_the_config_schema_imports_no_learner_module():
    config_modules = [m for m in MODULES if m.startswith("pipo_jax.config")]
    assert {"pipo_jax.config.schema", "pipo_jax.config.sections", "pipo_jax.config.registry"} <= set(config_modules)
    bad = [f"{m}:{line} imports {target}" for m, target, line in _package_edges() if m in config_modules
           and target.startswith(tuple(f"pipo_jax.{p}" for p in LEARNER))]
    assert not bad, "the config schema importing the learner:\n" + "\n".join(bad)
    out = subprocess.run([sys.executable, "-c", _SCHEMA_PROBE], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_probe_sees_a_learner_import():
    # the probe above can fail: importing a learner module shows in its list
    probe = _SCHEMA_PROBE.replace("import sys\n", "import sys\nimport pipo_jax.losses.kl\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert "pipo_jax.losses.kl" in out.stdout, out.stdout + out.stderr


# The learner reaches a task through the Task protocol (ARCHITECTURE.md 3): besides the protocol and
# pass@k it imports no task module; the config -> task factory reads the registry, which names the
# task modules by path (imported only when chosen) and imports nothing but the protocol and the config
# registry it pushes each task's name and settings section into (light modules of the schema alone).
TASK_INTERFACE = ("pipo_jax.tasks.protocol", "pipo_jax.tasks.passk")
READS_REGISTRY = ("pipo_jax.run.task_config",)


def test_the_learner_imports_no_task_but_the_protocol():
    bad = [f"{m}:{line} imports {target}" for m, target, line in _package_edges()
           if m.startswith("pipo_jax.rl") and target.startswith("pipo_jax.tasks") and target not in TASK_INTERFACE
           and not (target == "pipo_jax.tasks.registry" and m in READS_REGISTRY)]
    assert not bad, "the learner importing a task module:\n" + "\n".join(bad)


def test_the_task_registry_is_light_and_names_existing_modules():
    bad = [f"{m}:{line} imports {target}" for m, target, line in _package_edges()
           if m == "pipo_jax.tasks.registry" and target not in ("pipo_jax.tasks.protocol", "pipo_jax.config.registry")]
    assert not bad, "the registry must import only the protocol and the config registry:\n" + "\n".join(bad)
    from pipo_jax.tasks import registry

    for entry in registry.TASKS.values():
        assert entry.module in MODULES, f"task {entry.name!r}: no module {entry.module}"
        for path in entry.settings:  # a task's settings: a module of the schema alone, beside the task's
            module = path.partition(":")[0]
            assert module in MODULES and {t for m, t, _ in _package_edges() if m == module} <= {"pipo_jax.config.schema"}, path
        tree = ast.parse(MODULES[entry.module].read_text())
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        assert entry.constructor in defined and set(entry.task_classes) <= defined, entry
        if entry.chat:  # its chat renderer: a class of a module of pipo_jax/tasks
            module, _, name = entry.chat.partition(":")
            assert module in MODULES and name in {n.name for n in ast.parse(MODULES[module].read_text()).body
                                                  if isinstance(n, ast.ClassDef)}, entry.chat


# The learner's packages: `pipo_jax/rl/` (the learner) knows nothing of `pipo_jax/run/` (the job around
# it: the layer order says so); a rollout's path from sampling to the update only goes down: `rollout`
# makes `experience.Rollout`s, `learn` consumes them, neither imports the other; the PIPO controller
# is pure math over the losses.
def _targets(module: str) -> set[str]:
    return {t for m, t, _ in _package_edges() if m == module}


def test_a_rollouts_path_to_the_update_only_goes_down():
    assert "pipo_jax.rl.rollout" not in _targets("pipo_jax.rl.learn")
    assert "pipo_jax.rl.learn" not in _targets("pipo_jax.rl.rollout")
    assert not _targets("pipo_jax.rl.experience") & {"pipo_jax.rl.rollout", "pipo_jax.rl.learn", "pipo_jax.rl.loop"}
    assert "pipo_jax.rl.experience" in _targets("pipo_jax.rl.learn") & _targets("pipo_jax.rl.rollout")


def test_the_pipo_controller_is_pure_math_over_the_losses():
    assert _targets("pipo_jax.rl.controller") == {"pipo_jax.losses.pipo"}
    assert not any(t.startswith("pipo_jax.run") for m, t, _ in _package_edges() if m.startswith("pipo_jax.rl"))


# What importing a module may not load: the spec is pure (no warm-up, no verifier, no sandbox), and
# the task factory loads only the chosen task's module.
_PROBE = """
import sys
import pipo_jax.rl.spec
heavy = ("pipo_jax.tasks.code", "pipo_jax.tasks.math", "pipo_jax.tasks.dataset", "pipo_jax.tasks.reasoning_gym",
         "pipo_jax.tasks.arithmetic", "pipo_jax.run.warmup", "pipo_jax.run.task_config")
print(sorted(m for m in heavy if m in sys.modules))
from configs import grpo
from pipo_jax.config.sections import RunConfig
from pipo_jax.run.task_config import make_task
make_task(RunConfig.from_config(grpo.get_config("micro")))
print(sorted(m for m in heavy[:4] if m in sys.modules))
"""


def test_importing_the_spec_loads_no_task_module_and_the_factory_only_the_chosen_one():
    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "[]"], out.stdout + out.stderr


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(edges) + 100))

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            strongconnect(v)
    return out


def test_no_import_cycles_between_modules():
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for m, target, _ in _package_edges():
        # A package's __init__ importing its own modules is not a cycle with them.
        if target != m and not (MODULES[m].name == "__init__.py" and target.startswith(m + ".")):
            edges[m].add(target)
    assert not _cycles(edges)


def test_no_function_level_imports_but_optional_dependencies():
    bad = [f"{m}:{line} imports {name}" for m, imps in IMPORTS.items() for name, line, fn in imps
           if fn and name.split(".")[0] not in OPTIONAL_THIRD_PARTY]
    assert not bad, "function-level imports (move them to module level):\n" + "\n".join(bad)


@pytest.mark.parametrize("source, expected", [
    ("import a\n\ndef f():\n    from b import c\n", [("a", 1, False), ("b", 4, True)]),
    ("try:\n    import a\nexcept ImportError:\n    a = None\n", [("a", 2, False)]),
    ("class K:\n    def m(self):\n        import a\n", [("a", 3, True)]),
])
def test_imports_are_read_at_module_and_function_level(source, expected, tmp_path, monkeypatch):
    path = tmp_path / "probe.py"
    path.write_text(source)
    monkeypatch.setitem(MODULES, "probe", path)
    assert _imports("probe") == expected


def test_the_graph_holds_the_imports_made_by_importlib():
    """child.py imports the judge and the runner with `importlib.import_module`: edges the cycle test sees."""
    edges = {(m, t) for m, t, _ in _package_edges()}
    assert {("pipo_jax.tasks.code.child", "pipo_jax.tasks.code.judge"),
            ("pipo_jax.tasks.code.child", "pipo_jax.tasks.code.runner")} <= edges
    assert ("pipo_jax.tasks.code.judge", "pipo_jax.tasks.code.child") not in edges  # the circle that was


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


# The config schema (ARCHITECTURE.md 3 "A config key"): a key's type, default, description and
# constraint are declared once, with `schema.key(...)`, in `config/sections.py`, or for a method's or a
# task's own keys in the settings section registered beside its code; `configs/base.py:base_config`
# builds the ml-collections defaults from those declarations and sets none itself.
KEY_DECLARATIONS = "pipo_jax.config.sections"


def _settings_modules() -> set[str]:
    """The modules of every registered settings section (`configs.base` imports every registry)."""
    import configs.base  # noqa: F401
    from pipo_jax.config import registry

    return {cls.__module__ for cls in registry.sections().values()}


def _declares_keys(module: str) -> list[int]:
    """Lines of `module` that import or call `pipo_jax.config.schema.key`."""
    tree = ast.parse(MODULES[module].read_text())
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "pipo_jax.config.schema":
            lines += [node.lineno for a in node.names if a.name == "key"]
        elif isinstance(node, ast.Attribute) and node.attr == "key" and isinstance(node.value, ast.Name) \
                and node.value.id == "schema":
            lines.append(node.lineno)
    return lines


def test_config_keys_are_declared_only_in_sections():
    settings = _settings_modules()
    assert {"pipo_jax.tasks.arithmetic_settings", "pipo_jax.tasks.dataset_settings"} <= settings
    declaring = {KEY_DECLARATIONS} | settings
    bad = [f"{m}:{line}" for m in MODULES if m not in declaring for line in _declares_keys(m)]
    assert not bad, "config keys declared outside config/sections.py and the settings sections:\n" + "\n".join(bad)
    assert _declares_keys(KEY_DECLARATIONS)
    tree = ast.parse(MODULES["configs.base"].read_text())
    body = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "base_config")
    sets = [n.lineno for n in ast.walk(body) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))]
    assert not sets, f"configs/base.py:base_config sets defaults itself (lines {sets}); declare them in a section"


# The ml-collections config stops at the entry points (`experiments/*.py`, `configs/`): they parse it once
# (`RunConfig.from_config(c)`) and everything under pipo_jax/ reads the typed sections. Only the schema,
# which builds the ml-collections defaults from the declarations (`schema.defaults`), touches it.
CONFIG_DICT_BUILDER = "pipo_jax.config.schema"
# ConfigDict's own names: a module that calls them reads a ConfigDict, imported or not.
CONFIG_DICT_NAMES = frozenset({"ConfigDict", "FrozenConfigDict", "FieldReference", "config_dict", "placeholder",
                               "copy_and_resolve_references", "to_json_best_effort", "get_ref", "get_oneway_ref",
                               "ignore_type", "unlocked"})


def _config_dict_uses(module: str) -> list[str]:
    """'<line>: <what>' for each import of ml_collections and each use of a ConfigDict name in `module`."""
    out = [f"{line}: imports {name}" for name, line, _ in IMPORTS[module] if name.split(".")[0] == "ml_collections"]
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if name in CONFIG_DICT_NAMES:
            out.append(f"{node.lineno}: {name}")
    return out


def test_no_module_below_the_entry_points_reads_the_config_dict():
    bad = [f"{m}:{use}" for m in MODULES if m.startswith("pipo_jax.") and m != CONFIG_DICT_BUILDER
           for use in _config_dict_uses(m)]
    assert not bad, "modules under pipo_jax/ reading the ml-collections config (take typed sections):\n" + \
        "\n".join(bad)
    assert _config_dict_uses(CONFIG_DICT_BUILDER)  # the builder is where it is said to be


@pytest.mark.parametrize("source, found", [
    ("import ml_collections\n", ["1: imports ml_collections"]),
    ("from ml_collections import config_dict\n", ["1: imports ml_collections"]),
    ("def f(c):\n    return c.copy_and_resolve_references()\n", ["2: copy_and_resolve_references"]),
    ("def f(run):\n    return run.task.name\n", []),
])
def test_the_config_dict_check_sees_imports_and_reads(source, found, tmp_path, monkeypatch):
    path = tmp_path / "probe.py"
    path.write_text(source)
    monkeypatch.setitem(MODULES, "probe", path)
    monkeypatch.setitem(IMPORTS, "probe", _imports("probe"))
    assert _config_dict_uses("probe") == found
