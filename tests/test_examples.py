"""The command examples of README.md and docs/serving.md run against the README's own main job:
each `--policy` is its workdir (or a directory in it), each `--step` is a checkpoint that the main
job's `checkpoint.every` / `checkpoint.keep` / `iterations` keep (read from the preset the README
names, with its command-line overrides), each directory a snippet loads is one an example writes,
and each problem the docs tell you to type is inside what the main job's task trains on."""

import importlib.util
import pathlib
import re
import shlex

import jax.numpy as jnp
import pytest

from pipo_jax.run.checkpoint import Checkpointer, saved_steps

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "docs" / "serving.md"]
MAIN_JOB = re.compile(r"^python -m experiments\.train (.*--workdir=\S+.*)$", re.M)
EXAMPLE = re.compile(r"python -m experiments\.(export|chat|eval|serve)((?: --[\w.]+(?:=[^\s`'\"|)]+)?)*)")
LOADED = re.compile(r"from_pretrained\(\"([^\"]+)\"\)")
TYPED = re.compile(r"(?:type|then) `(\d+\s*[-+*]\s*\d+)`")
PIPED = re.compile(r"printf '([^']*)' \| python -m experiments\.chat")


def _flags(text: str) -> dict[str, str]:
    return dict(arg[2:].split("=", 1) if "=" in arg else (arg[2:], "true") for arg in shlex.split(text)
                if arg.startswith("--"))


def main_job():
    """(workdir, config) of the README's main job: the first `experiments.train` command with a workdir."""
    found = MAIN_JOB.search((ROOT / "README.md").read_text())
    assert found, "README.md has no `python -m experiments.train ... --workdir=...` command"
    flags = _flags(found.group(1))
    path, _, preset = flags["config"].partition(":")
    spec = importlib.util.spec_from_file_location("readme_config", ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(preset)
    for key, value in flags.items():  # the command's overrides, typed like the preset's value
        if key.startswith("config."):
            *parents, leaf = key.split(".")[1:]
            section = config
            for p in parents:
                section = section[p]
            old = section[leaf]
            section[leaf] = (value == "true") if isinstance(old, bool) else type(old)(value)
    return flags["workdir"], config


def kept_steps(config) -> list[int]:
    """The checkpoints a finished run keeps: it saves iteration 0 (after the warm-up), every
    `checkpoint.every` iterations and the final one; orbax keeps the newest `checkpoint.keep`."""
    n, every, keep = config.iterations, config.checkpoint.every, config.checkpoint.keep
    saved = sorted({0, n, *(range(every, n, every) if every else ())})
    return saved[-keep:] if keep else saved


def examples() -> list[tuple[str, str, dict[str, str]]]:
    """(page, script, flags) of every `python -m experiments.<script> ...` example of the pages."""
    return [(page.name, m.group(1), _flags(m.group(2))) for page in PAGES
            for m in EXAMPLE.finditer(page.read_text())]


def test_the_main_job_keeps_the_checkpoints_that_kept_steps_names(tmp_path):
    """`kept_steps` is what the checkpointer keeps when the main job's schedule is saved into it."""
    _, config = main_job()
    ckpt = Checkpointer(str(tmp_path / "checkpoints"), keep=config.checkpoint.keep, async_save=False)
    state = {"w": jnp.zeros((2,))}
    for step in sorted({0, config.iterations, *range(config.checkpoint.every, config.iterations,
                                                       config.checkpoint.every)}):
        ckpt.save(step, state)
    ckpt.wait()
    ckpt.close()
    assert saved_steps(str(tmp_path / "checkpoints")) == kept_steps(config)
    assert kept_steps(config) == [80, 90, 100]  # the README's main job: 100 iterations, every 10, keep 3


def test_every_example_runs_against_the_main_jobs_workdir_and_kept_checkpoints():
    workdir, config = main_job()
    kept = kept_steps(config)
    found = examples()
    assert {script for _, script, _ in found} >= {"export", "chat", "eval", "serve"}, found
    outs = {f"{workdir}/hf_export"}
    for page, script, flags in found:
        policy = flags.get("policy")
        assert policy == workdir or (policy or "").startswith(workdir + "/"), (page, script, flags)
        if "step" in flags:
            assert int(flags["step"]) in kept, (f"{page}: `experiments.{script} --step={flags['step']}`: the main "
                                                f"job keeps only the checkpoints of steps {kept}")
        if script == "export":
            outs.add(flags["out"])
    for page in PAGES:
        for path in LOADED.findall(page.read_text()):
            assert path in outs, f"{page.name}: from_pretrained({path!r}) loads no directory an example writes ({outs})"


def test_the_problems_the_docs_have_you_type_are_inside_the_main_jobs_task():
    from pipo_jax.config.sections import RunConfig
    from pipo_jax.tasks.arithmetic_chat import ArithmeticPrompts
    from pipo_jax.tasks import arithmetic

    _, config = main_job()
    prompts = ArithmeticPrompts(arithmetic.from_config(RunConfig.from_config(config)))
    typed = []
    for page in PAGES:
        text = page.read_text()
        typed += TYPED.findall(text)
        typed += [line for piped in PIPED.findall(text) for line in piped.split("\\n") if line]
    assert len(typed) >= 2, typed
    for line in typed:
        assert prompts.notice(line) is None, (line, prompts.notice(line))


@pytest.mark.parametrize("bad, why", [("--step=40", "keeps only"), ("--policy=runs/other", "runs/other")])
def test_the_check_catches_an_example_the_main_job_cannot_run(monkeypatch, tmp_path, bad, why):
    page = tmp_path / "page.md"
    page.write_text(f"`python -m experiments.export --policy=runs/tiny {bad} --out=runs/tiny/e`\n"
                    + "".join(f"`python -m experiments.{s} --policy=runs/tiny`\n" for s in ("chat", "eval", "serve")))
    monkeypatch.setitem(globals(), "PAGES", [page])
    with pytest.raises(AssertionError, match=why):
        test_every_example_runs_against_the_main_jobs_workdir_and_kept_checkpoints()
