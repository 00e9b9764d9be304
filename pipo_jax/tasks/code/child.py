"""The judge's and the runner's entry point: ``python -I child.py --harness REPORT_FD`` (the judge)
and ``python -I child.py --runner REQUEST_FD REPLY_FD`` (the runner).

``-I`` keeps this directory, the working directory and the environment off ``sys.path``. The
package's modules are then found through ``pipo_jax.tasks.code.__path__`` alone, which names
this directory: ``pipo_jax``, ``pipo_jax.tasks`` and ``pipo_jax.tasks.code`` are registered as
empty packages (their ``__init__`` files never run), so the children import the standard
library and these stdlib-only modules, nothing else of the project and nothing from a
directory the runner can write (its scratch directory is neither here nor on ``sys.path``).
"""
import importlib
import os
import sys
import types


def _this_package_only() -> None:
    """Registers the package chain with this directory as the only place of its modules."""
    here = os.path.dirname(os.path.abspath(__file__))
    for name, path in (("pipo_jax", []), ("pipo_jax.tasks", []), ("pipo_jax.tasks.code", [here])):
        module = types.ModuleType(name)
        module.__path__ = path
        sys.modules[name] = module


def _main(argv: list[str]) -> None:
    _this_package_only()
    if len(argv) == 3 and argv[1] == "--harness":
        importlib.import_module("pipo_jax.tasks.code.judge")._judge_main(int(argv[2]))
    elif len(argv) == 4 and argv[1] == "--runner":
        importlib.import_module("pipo_jax.tasks.code.runner")._runner_main(int(argv[2]), int(argv[3]))
    else:
        sys.exit(f"usage: {argv[0]} --harness REPORT_FD | --runner REQUEST_FD REPLY_FD")


if __name__ == "__main__":
    _main(sys.argv)
