"""A CPU user's console at start-up: no jax backend probe (`Unable to initialize backend 'tpu'`), no
transformers notice about a missing torch (the package's install has none), no TensorFlow load-time
banners (`Could not find cuda drivers`, oneDNN), while a real error line still reaches stderr."""

import os
import pathlib
import subprocess
import sys

import jax
import pytest

from configs import grpo
from pipo_jax import native_banners
from pipo_jax.models import qwen3
from pipo_jax.run import export
from tests.typed import spec_of

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOISE = ("Unable to initialize backend", "PyTorch was not found", "Could not find cuda drivers",
         "oneDNN custom operations", "absl::InitializeLog", "This TensorFlow binary")


def _user_env() -> dict[str, str]:
    """The environment of a user's shell: jax free to probe its backends, none of the variables the
    experiments scripts set for themselves."""
    drop = ("JAX_PLATFORMS", "TRANSFORMERS_NO_ADVISORY_WARNINGS", "TF_CPP_MIN_LOG_LEVEL")
    return {k: v for k, v in os.environ.items() if k not in drop} | {"PYTHONPATH": str(ROOT)}


def test_export_starts_quietly_without_torch(tmp_path):
    spec = spec_of(grpo.get_config("micro"))
    policy = export.write_export(str(tmp_path / "policy"), spec.model,
                                 qwen3.init_params(spec.model, jax.random.PRNGKey(0), std=0.3), spec=spec)
    # torch hidden: the package's own install (`pip install -e .`) has none
    code = ("import runpy, sys; sys.modules['torch'] = None; "
            f"sys.argv = ['export', '--policy={policy}', '--out={tmp_path / 'out'}']; "
            "runpy.run_module('experiments.export', run_name='__main__')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=_user_env(),
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == f"exported {policy} to {tmp_path / 'out'}"
    assert [line for line in res.stderr.splitlines() if any(n in line for n in NOISE)] == [], res.stderr
    assert (tmp_path / "out" / "model.safetensors").exists()


_BANNER_SCRIPT = r"""
import os, sys
from pipo_jax import native_banners
with native_banners.banners_dropped():
    # what TensorFlow 2.21's two libraries print while they load on a machine without a GPU driver
    for _ in range(2):
        os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n")
        os.write(2, b"I0000 00:00:1796643978.705959   17646 port.cc:153] oneDNN custom operations are on. You may "
                    b"see slightly different numerical results\n")
        os.write(2, b"I0000 00:00:1796643978.707630   17646 cudart_stub.cc:31] Could not find cuda drivers on your "
                    b"machine, GPU will not be used.\n")
    os.write(2, b"E0000 real error from a native library\n")
    print("python warning", file=sys.stderr)
try:
    with native_banners.banners_dropped():
        os.write(2, b"partial line before a failed import")
        raise ImportError("no module")
except ImportError:
    print("\nafter", file=sys.stderr)
"""


def test_tensorflows_load_banners_are_dropped_and_everything_else_kept():
    res = subprocess.run([sys.executable, "-c", _BANNER_SCRIPT], capture_output=True, text=True, cwd=ROOT,
                         env=_user_env(), timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stderr == ("E0000 real error from a native library\npython warning\n"
                          "partial line before a failed import\nafter\n")
    assert native_banners.kept_lines("a\nCould not find cuda drivers on your machine, GPU will not be used.\nb") == "a\nb"


_QUIET_SCRIPT = """
import json, logging, sys
from experiments import cli
sys.argv = ["command"]
for name in cli.CHATTY_LOGGERS:
    logging.getLogger(name).setLevel(logging.NOTSET)
cli.run(lambda argv: print(json.dumps({n: logging.getLogger(n).level for n in cli.CHATTY_LOGGERS})))
"""


def test_the_libraries_stay_quiet_inside_main():
    """`cli.run` quiets the chatty loggers where `main` runs: absl's `app.run` puts its own logger back to
    NOTSET (the root's INFO) while it sets up, so quieting before it would let orbax's checkpoint notes
    through to every command's console. In a process of its own: absl's flags are one global registry,
    and a command module another test imported defines required flags of its own."""
    import json
    import logging

    from experiments import cli

    res = subprocess.run([sys.executable, "-c", _QUIET_SCRIPT], capture_output=True, text=True, cwd=ROOT,
                         env=_user_env(), timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1]) == {name: logging.WARNING for name in cli.CHATTY_LOGGERS}
