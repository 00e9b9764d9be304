"""JAX's persistent compilation cache of the experiments' commands (pipo_jax/run/compile_cache.py):
where it lives, how it is moved or turned off, and that the tests' own cache wins."""

import ast
import os
import pathlib
import subprocess
import sys

import jax
import pytest

from pipo_jax.run import compile_cache as cc

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_choose_precedence():
    env = {"XDG_CACHE_HOME": "/x/cache"}
    default = cc.choose(None, env, None)
    assert default.source == "default"
    assert default.path == os.path.join("/x/cache", "pipo_jax", "jax_cache", cc.host_tag())
    assert cc.choose(None, {}, None).path == os.path.join(os.path.expanduser("~"), ".cache", "pipo_jax",
                                                           "jax_cache", cc.host_tag())
    assert cc.choose(None, env, "/tests/cache") == cc.CacheChoice("/tests/cache", f"{cc.JAX_ENV} / jax.config")
    env[cc.ENV] = "/mine"
    assert cc.choose(None, env, "/tests/cache") == cc.CacheChoice("/mine", cc.ENV)
    assert cc.choose("/flag", env, "/tests/cache") == cc.CacheChoice("/flag", "--compilation_cache")
    for off in ("off", "OFF", " none ", "0", "false"):
        assert cc.choose(off, env, "/tests/cache").path is None
        assert cc.choose(None, {cc.ENV: off}, "/tests/cache").path is None
    assert cc.choose("", {}, None).source == "default"  # an empty flag is no choice


def test_host_tag_names_the_cpu(monkeypatch):
    tag = cc.host_tag()
    monkeypatch.setattr(cc.provenance, "schedulable_cpus", lambda: 999)
    assert cc.host_tag() != tag  # another core count (XLA:CPU's thread pool): another cache
    monkeypatch.setattr(cc.provenance, "cpu_model", lambda: "another CPU")
    assert cc.host_tag() != tag


@pytest.fixture
def restore_jax_cache_config():
    """jax.config as the tests set it (conftest), after a test that starts with no cache directory set."""
    saved = {k: getattr(jax.config, k) for k in ("jax_compilation_cache_dir", cc.MIN_COMPILE_TIME_KEY)}
    jax.config.update("jax_compilation_cache_dir", None)
    yield
    for k, v in saved.items():
        jax.config.update(k, v)


def test_configure_sets_jax_and_exports(tmp_path, restore_jax_cache_config):
    environ = {"XDG_CACHE_HOME": str(tmp_path)}
    choice = cc.configure("", environ)
    assert choice.path is not None and choice.path.startswith(str(tmp_path)) and os.path.isdir(choice.path)
    assert jax.config.jax_compilation_cache_dir == choice.path == environ[cc.JAX_ENV]
    assert cc.current_dir() == choice.path
    assert jax.config.jax_persistent_cache_min_compile_time_secs == cc.MIN_COMPILE_TIME_S
    assert cc.ENV not in environ  # a child process chooses as this one did
    moved = cc.configure(str(tmp_path / "moved"), environ)
    assert environ[cc.ENV] == environ[cc.JAX_ENV] == moved.path == str(tmp_path / "moved")
    off = cc.configure("off", environ)
    assert off.path is None and jax.config.jax_compilation_cache_dir is None and cc.current_dir() is None
    assert environ[cc.ENV] == "off" and cc.JAX_ENV not in environ
    assert "off" in off.describe() and cc.describe_contents(None) == "off"


def test_explicit_directory_that_cannot_be_made_is_an_error(tmp_path, restore_jax_cache_config):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError):
        cc.configure(str(tmp_path / "file" / "cache"), {})
    off = cc.configure(None, {"XDG_CACHE_HOME": str(tmp_path / "file")})  # the default: off, with a warning
    assert off.path is None and jax.config.jax_compilation_cache_dir is None


def test_describe_contents(tmp_path):
    assert cc.describe_contents(str(tmp_path)) == "empty"
    (tmp_path / "jit_f-abc-cache").write_bytes(b"x" * 3_000_000)
    (tmp_path / "jit_f-abc-atime").write_bytes(b"x")
    assert cc.describe_contents(str(tmp_path)) == "1 programs, 3 MB"


def _entry_scripts():
    """experiments/*.py with a `__main__` block."""
    return [p for p in sorted((ROOT / "experiments").glob("*.py")) if 'if __name__ == "__main__"' in p.read_text()]


def test_every_command_sets_the_cache_up():
    """Each command runs through `cli.run` (which configures the cache before `main`) or configures it itself."""
    missing = []
    for path in _entry_scripts():
        tree = ast.parse(path.read_text())
        calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        if not calls & {"cli.run", "compile_cache.configure"}:
            missing.append(path.name)
    assert len(_entry_scripts()) >= 10 and not missing


# A command's main as the experiments' commands run it: one program, compiled or loaded.
SCRIPT = ("import jax, jax.numpy as jnp\n"
          "from experiments import cli\n"
          "cli.run(lambda argv: print(float(jax.jit(lambda x: jnp.sin(x).sum() * 3.0)(jnp.arange(7.0)))))\n")


def _run(env, *args):
    env = dict(env, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", SCRIPT, *args], env=env, capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return out


def _entries(path):
    return sorted(p.name for p in pathlib.Path(path).glob("*-cache")) if os.path.isdir(path) else []


@pytest.mark.slow  # five fresh interpreters, each importing jax and the experiments' CLI
def test_a_command_stores_its_programs_where_chosen(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in (cc.ENV, cc.JAX_ENV)}  # not the tests' cache
    env.update(XDG_CACHE_HOME=str(tmp_path / "xdg"), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    _run(env)
    default = tmp_path / "xdg" / "pipo_jax" / "jax_cache" / cc.host_tag()
    assert any(name.startswith("jit__lambda") for name in _entries(default))  # on by default
    stored = _entries(default)
    _run(env, f"--compilation_cache={tmp_path / 'moved'}")
    assert len(_entries(tmp_path / "moved")) == len(stored)  # JAX's key holds the directory: another name
    _run(dict(env, **{cc.JAX_ENV: str(tmp_path / "tests")}))  # the tests' setting (conftest) wins over the default
    assert len(_entries(tmp_path / "tests")) == len(stored) and _entries(default) == stored
    for name in _entries(default):
        (default / name).unlink()
    _run(env, "--compilation_cache=off")
    _run(dict(env, **{cc.ENV: "off"}))
    assert _entries(default) == []
