"""Every declared key of every preset of every `configs/*.py` file is settable from the command
line, whatever its default (a preset's None included), through absl + ml-collections'
`config_flags` as `experiments/train.py` parses them. Parse only: nothing trains."""

from __future__ import annotations

import dataclasses
import importlib
import pathlib

import pytest
from absl import flags
from ml_collections import config_flags

from configs import base
from pipo_jax.config import schema
from pipo_jax.config.sections import ConfigError, RunConfig

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIG_FILES = sorted(p.stem for p in (ROOT / "configs").glob("*.py") if p.stem not in ("__init__", "base"))


def _presets(name: str) -> list[str]:
    """The presets `configs/<name>.py` accepts (the `authors_*` ones where it has them)."""
    module = importlib.import_module(f"configs.{name}")
    out = []
    for preset in base.PRESETS + base.AUTHORS_PRESETS:
        try:
            module.get_config(preset)
        except ValueError:
            continue
        out.append(preset)
    return out


CASES = [(name, preset) for name in CONFIG_FILES for preset in _presets(name)]


def _section_of(dotted: str):
    """The section class that declares the dotted key, and the key's field."""
    cls = schema.assembled(RunConfig)  # with the sections the registries registered (a method's, a task's)
    *parents, leaf = dotted.split(".")
    for part in parents:
        cls = schema.assembled(schema._subsection(next(f for f in dataclasses.fields(cls) if f.name == part)))
    return cls, next(f for f in dataclasses.fields(cls) if f.name == leaf)


def _valid(cls, f, value) -> bool:
    try:
        schema.check_value(cls, f, value)
    except ConfigError:
        return False
    return True


def _candidates(kind: str, current):
    if kind == "bool":
        return [not current] if current is not None else [True, False]
    if kind == "int":
        base_value = current if current is not None else 0
        return [base_value + 1, base_value + 2, 2 * base_value, base_value - 1, 1, 2, 3, 4, 8, 16, 0]
    if kind == "float":
        base_value = current if current is not None else 0.0
        return [base_value + 0.25, base_value * 0.5, base_value + 1.5, base_value - 0.25, 0.3, 0.7, 1.5, 2.5, 0.0]
    # free strings, an operator set (task.arithmetic.ops), a JSON object (task.reasoning_gym.config), then
    # the current value (model.param_dtype: float32 is its one valid value)
    return ["x_override", "1", "1,2", "+", '{"min_value": 2, "max_value": 9}', current]


def override_value(dotted: str, current):
    """(a value valid for the key by its declaration, different from `current` where one is, and
    its command-line text)."""
    cls, f = _section_of(dotted)
    kind = schema._field_type(f).name
    declared = f.metadata.get("choices")
    options = list(schema.choices_of(declared)) if declared is not None else _candidates(kind, current)
    valid = [v for v in options if _valid(cls, f, v)]
    assert valid, f"no valid command-line value found for {dotted}"
    value = next((v for v in valid if v != current), valid[0])
    text = str(value).lower() if kind == "bool" else repr(value) if kind == "float" else str(value)
    return value, text


def _parse(argv: list[str]):
    """`experiments/train.py`'s `--config` flag parsing `argv` (config_flags reads the overrides from
    the argv it is given; the script's is `sys.argv`)."""
    values, argv = flags.FlagValues(), ["train"] + argv
    config_flags.DEFINE_config_file("config", "configs/grpo.py:tiny", "run config file:preset", flag_values=values,
                                    sys_argv=argv)
    values(argv)
    return values.config


@pytest.mark.parametrize("name,preset", CASES)
def test_every_key_is_settable_on_the_command_line(name, preset, monkeypatch):
    monkeypatch.chdir(ROOT)
    config = importlib.import_module(f"configs.{name}").get_config(preset)
    declared = schema.declarations(RunConfig)
    wanted, argv = {}, [f"--config=configs/{name}.py:{preset}"]
    for dotted in declared:  # every key, the settings of methods and tasks the preset does not run included
        value, text = override_value(dotted, schema_value(config, dotted))
        wanted[dotted] = value
        argv.append(f"--config.{dotted}={text}")
    assert set(wanted) == set(declared)
    parsed = _parse(argv)
    for dotted, value in wanted.items():
        got = schema_value(parsed, dotted)
        assert got == value and type(got) is type(value), (dotted, got, value)


def schema_value(config, dotted: str):
    for part in dotted.split("."):
        config = config[part]
    return config


def test_a_preset_none_parses_as_its_type():
    # the case: tiny sets warmup.target_accuracy to None; the override is a float
    parsed = _parse(["--config=configs/grpo.py:tiny", "--config.warmup.target_accuracy=0.3"])
    assert parsed.warmup.target_accuracy == 0.3
    assert importlib.import_module("configs.grpo").get_config("tiny").warmup.target_accuracy is None
    with pytest.raises(flags.IllegalFlagValueError):
        _parse(["--config=configs/grpo.py:tiny", "--config.warmup.target_accuracy=abc"])
