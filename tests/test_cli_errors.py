"""The experiments' scripts print a config or data error as one line with exit status 2
(not a traceback); a dataset task's missing settings come all at once; a JSONL error
names the column where the line ends."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from pipo_jax.data.sources import DataError, SourceConfig, load_examples
from tests import compilation_cache
from tests.scripts import run_script

ROOT = pathlib.Path(__file__).resolve().parents[1]
# No "Unable to initialize backend 'tpu'" log line. The subprocesses use a compilation cache of
# their own, beside the shared one: a warning of the cache the concurrent test worker writes to
# (e.g. an entry it half-wrote when killed, before its repair) would be a second stderr line
# beside the one-line error these tests check. This file's tests run one at a time on one worker.
_ENV = dict(os.environ, JAX_PLATFORMS="cpu",
            JAX_COMPILATION_CACHE_DIR=compilation_cache.private_dir("cli_errors"))


def _run(*args):
    """`python -m *args` (run by `tests/scripts.py`'s server, with the dependencies imported once)."""
    return run_script("-m", *args, env=_ENV)


def test_unknown_override_is_one_line_with_the_hint():
    # A fresh interpreter here, as a user's shell starts it; the other tests use the script server.
    res = subprocess.run([sys.executable, "-m", "experiments.train", "--config=configs/grpo.py:micro",
                          "--config.pipo.lamb=0.2", "--check_config"], capture_output=True, text=True, cwd=ROOT,
                         timeout=300, env=_ENV)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "error: command-line override: --config.pipo.lamb: unknown key; did you mean --config.pipo.lam?"]


def test_an_unknown_keys_hint_names_the_full_keys():
    from experiments import cli

    assert cli.unknown_override(["--workdir=x", "--config.pipo.windw=3"]) == (
        "--config.pipo.windw: unknown key; did you mean --config.pipo.window?")
    assert cli.unknown_override(["--config.warmup.target_acc=0.3"]) == (
        "--config.warmup.target_acc: unknown key; did you mean --config.warmup.target_accuracy or "
        "--config.warmup.target_pass_rate?")
    # an unknown section: the closest keys among all
    assert cli.unknown_override(["--config.pipox.lam=1"]).startswith(
        "--config.pipox.lam: unknown key; did you mean --config.pipo.lam or ")
    assert cli.unknown_override(["--config.zzzz=3"]) == "--config.zzzz: unknown key"
    assert cli.unknown_override(["--config.pipo.lam=0.2", "--config.pipo=x", "--config=configs/grpo.py:tiny"]) is None


def test_dataset_task_lists_every_missing_setting_at_once(tmp_path):
    res = _run("experiments.train", "--config=configs/grpo.py:micro", "--config.task.name=math",
               f"--workdir={tmp_path / 'run'}")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: config: task.name='math' needs --config.model.path=")
    for key in ("model.path", "task.dataset.path", "log.jit_loop=false", "rollout.max_new_tokens", "warmup.enabled=false"):
        assert f"--config.{key}" in lines[0], key
    assert not (tmp_path / "run").exists()  # nothing written for a refused run


def test_eval_on_a_missing_policy_is_one_line(tmp_path):
    res = _run("experiments.eval", f"--policy={tmp_path / 'nothing'}", "--builtin_problems=4")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'nothing'}: neither a Hugging Face directory (config.json) nor a run workdir "
        "(checkpoints/)"]


def test_jsonl_error_at_the_end_of_a_line_names_that_column(tmp_path):
    path = tmp_path / "d.jsonl"
    line = '{"problem": "1+1", "answer": "2"'  # 32 characters, the closing brace missing
    path.write_text('{"problem": "2+2", "answer": "4"}\n' + line + "\n")
    with pytest.raises(DataError, match=r"d\.jsonl:2: invalid JSON \(Expecting ',' delimiter at column 33\)"):
        load_examples(SourceConfig(str(path)))


# ----------------------------------------------------------------------------- one line, exit 2

def _one_line_error(res, *fragments):
    """`res` exited 2 with exactly one stderr line, `error: ...`, holding every fragment."""
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in res.stderr, res.stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def test_a_value_of_the_wrong_type_is_one_line_naming_the_key():
    res = _run("experiments.train", "--config=configs/grpo.py:micro", "--config.pipo.window=abc", "--check_config")
    _one_line_error(res, "--config.pipo.window=abc", "invalid literal for int()")
    res = _run("experiments.train", "--config=configs/grpo.py:micro", "--config.pipo.enabled=maybe", "--check_config")
    _one_line_error(res, "--config.pipo.enabled=maybe", "Non-boolean argument")


def test_an_unknown_preset_or_config_file_is_one_line_naming_it():
    res = _run("experiments.train", "--config=configs/grpo.py:nope", "--check_config")
    _one_line_error(res, "--config=configs/grpo.py:nope", "unknown preset 'nope'", "micro")
    res = _run("experiments.train", "--config=configs/nope.py", "--check_config")
    _one_line_error(res, "--config=configs/nope.py: cannot load the config file", "No such file or directory")


def test_an_unknown_flag_is_one_line():
    _one_line_error(_run("experiments.train", "--config=configs/grpo.py:micro", "--no_such_flag=1"),
                    "Unknown command line flag 'no_such_flag'")


def test_a_workdir_naming_a_file_is_one_line_and_the_file_is_kept(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("keep me\n")
    res = _run("experiments.train", "--config=configs/grpo.py:micro", "--config.warmup.enabled=false",
               f"--workdir={path}")
    _one_line_error(res, str(path), "is a file, not a directory")
    assert path.read_text() == "keep me\n"
    _one_line_error(_run("experiments.train", "--config=configs/grpo.py:micro", "--workdir="), "--workdir: empty")


@pytest.mark.slow  # one short training run (~1 min on a loaded 2-core CPU)
def test_non_finite_updates_stop_the_run_in_one_line_naming_the_iteration(tmp_path):
    # lr = 1e30: the first update is finite, the next gradients overflow and are skipped.
    res = _run("experiments.train", "--config=configs/grpo.py:micro", "--config.warmup.enabled=false",
               "--config.train.lr=1e30", "--config.train.max_bad_steps=1", "--config.iterations=4",
               "--config.log.progress=false", "--config.checkpoint.export_hf=false", f"--workdir={tmp_path / 'run'}")
    _one_line_error(res, "train.max_bad_steps=1:", "non-finite (NaN / inf) gradients", "up to iteration ",
                    "lower train.lr")


def test_eval_with_a_k_above_n_is_one_line_naming_both(tmp_path):
    res = _run("experiments.eval", f"--policy={tmp_path}", "--builtin_problems=4", "--n=4", "--ks=1,8")
    _one_line_error(res, "--ks=1,8: pass@8 needs 1 <= k <= --n=4")
    _one_line_error(_run("experiments.eval", f"--policy={tmp_path}", "--builtin_problems=4", "--ks=1,x"),
                    "--ks=1,x: every entry must be a int")
    _one_line_error(_run("experiments.eval", "--builtin_problems=4"), "--policy")  # the required flag
    _one_line_error(_run("experiments.eval", f"--policy={tmp_path}", "--builtin_problems=4",
                         "--verify_batch_budget_s=0"), "--verify_*", "batch_budget_s must be > 0")


def test_eval_never_overwrites_a_file_it_did_not_write(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1, "reward_mean": 0.5}\n')
    for extra in ([], ["--overwrite"]):
        res = _run("experiments.eval", f"--policy={tmp_path}", "--builtin_problems=4", f"--out={log}", *extra)
        _one_line_error(res, f"--out={log}: the file exists and was not written by experiments.eval",
                        "refusing to overwrite it")
    assert log.read_text() == '{"step": 1, "reward_mean": 0.5}\n'


def test_eval_replaces_its_own_earlier_output_only_with_overwrite(tmp_path):
    out = tmp_path / "eval.json"
    out.write_text(json.dumps({"written_by": "experiments.eval", "policy": "/runs/a", "checkpoint_step": 3}))
    res = _run("experiments.eval", f"--policy={tmp_path / 'nothing'}", "--builtin_problems=4", f"--out={out}")
    _one_line_error(res, f"--out={out}: holds an earlier evaluation (policy /runs/a, step 3)", "--overwrite")
    # With --overwrite the output check passes and the next error is the missing policy.
    res = _run("experiments.eval", f"--policy={tmp_path / 'nothing'}", "--builtin_problems=4", f"--out={out}",
               "--overwrite")
    _one_line_error(res, "neither a Hugging Face directory")


@pytest.mark.parametrize("argv, fragments", [
    (("experiments.sweep", "--lams=0.1,abc"), ("--lams=0.1,abc: every entry must be a float",)),
    (("experiments.sweep", "--seeds=0,x"), ("--seeds='0,x': expected 'a-b' (inclusive) or a comma list",)),
    (("experiments.sweep", "--sweep=pipo.lam=0.1,abc", "--seeds=0-1"),
     ("sweep point pipo.lam=abc (seed 0): 'pipo.lam=abc': pipo.lam is a float",)),
    (("experiments.sweep", "--sweep=train.mini_batch_prompts=3"),
     ("sweep point train.mini_batch_prompts=3 (seed 0): config.train.mini_batch_prompts",)),
    (("experiments.sweep", "--sweep=pipo.lam"), ("--sweep=pipo.lam: expected KEY=VALUE[,VALUE...]",)),
    (("experiments.sweep", "--group_index=5"), ("--group_index=5: the study has 1 groups (0-0)",)),
    (("experiments.sweep", "--workers=0"), ("--workers=0: must be >= 1",)),
    (("experiments.main_job_seeds", "--seeds=3-1"), ("--seeds='3-1': empty range",)),
    (("experiments.main_job_seeds", "--seeds=a-b"), ("--seeds='a-b': expected 'a-b'",)),
    (("experiments.main_job_seeds", "--workers=0"), ("--workers=0: must be >= 1",)),
    (("experiments.main_job_seeds", "--extra=pipo.lam=1"), ("--extra=pipo.lam=1: each entry must read config.",)),
    (("experiments.compare", "--algorithms=nope"), ("--algorithms: no config file configs/nope.py",)),
    (("experiments.compare", "--preset=huge"), ("--preset=huge: unknown preset 'huge'",)),
    (("experiments.compare", "--seeds=x"), ("--seeds='x'",)),
    (("experiments.compare", "--iterations=-1"), ("--iterations=-1: must be >= 0",)),
    (("experiments.compare", "--workers=0"), ("--workers=0: must be >= 1",)),
    (("experiments.compare", "--group_index=2"), ("--group_index=2: the study has 2 groups (0-1)",)),
])
def test_the_other_scripts_bad_flags_are_one_line(tmp_path, argv, fragments):
    res = _run(*argv, f"--out={tmp_path / 'out'}")
    _one_line_error(res, *fragments)
    assert not (tmp_path / "out").exists()  # refused before writing anything


def test_figure3a_bad_arguments_are_one_line(tmp_path):
    script = str(ROOT / "experiments" / "figure3a.py")
    for args, fragment in (([f"--out={tmp_path / 'f.txt'}"], "must end in .png"),
                           ([f"--out={tmp_path / 'f.png'}", "--mc-groups=abc"], "invalid int value: 'abc'"),
                           ([f"--out={tmp_path / 'f.png'}", "--mc-groups=-1"], "--mc-groups=-1 must be >= 0")):
        res = run_script(script, *args, env=_ENV)
        _one_line_error(res, fragment)


@pytest.mark.slow  # a short training run, then three evaluations of it
def test_eval_records_the_checkpoint_step_and_refuses_a_silent_rerun(tmp_path):
    run = tmp_path / "run"
    res = _run("experiments.train", "--config=configs/grpo.py:micro", "--config.warmup.enabled=false",
               "--config.iterations=2", "--config.log.progress=false", "--config.checkpoint.export_hf=false",
               f"--workdir={run}")
    assert res.returncode == 0, res.stderr[-2000:]
    evaluate = ("experiments.eval", f"--policy={run}", "--builtin_problems=4", "--n=2", "--ks=1,2", "--batch_size=8")
    res = _run(*evaluate)
    assert res.returncode == 0, res.stderr[-2000:]
    out = run / "eval.2.json"  # the default path names the evaluated step
    record = json.loads(out.read_text())
    assert (record["written_by"], record["checkpoint_step"], record["policy"]) == ("experiments.eval", 2, str(run))
    assert record["n"] == 2 and record["ks"] == [1, 2] and "commit" in record["provenance"]
    assert set(record["results"]) == {"builtin_heldout"} and 0 <= record["results"]["builtin_heldout"]["pass@1"] <= 1
    # printed as fractions (as the trainer logs them), with the greedy accuracy on the same problems beside
    result = record["results"]["builtin_heldout"]
    assert 0 <= result["greedy_accuracy"] <= 1
    assert "| pass@1 | pass@2 | mean reward | greedy acc |" in res.stdout
    assert (f"| builtin_heldout | 4 | 2 | {result['pass@1']:.3f} | {result['pass@2']:.3f} | "
            f"{result['mean_reward']:.3f} | {result['greedy_accuracy']:.3f} |") in res.stdout
    _one_line_error(_run(*evaluate), f"--out={out}: holds an earlier evaluation", "step 2", "--overwrite")
    assert json.loads(out.read_text()) == record
    res = _run(*evaluate, "--overwrite", "--seed=1")
    assert res.returncode == 0, res.stderr[-2000:]
    again = json.loads(out.read_text())
    assert again["seed"] == 1 and again["checkpoint_step"] == 2
    _one_line_error(_run(*evaluate, "--step=99"), f"--step=99: {run} holds no checkpoint of that step (saved: [2])")


def test_main_job_seeds_reports_a_refused_seed_and_an_empty_collection_in_one_line(tmp_path):
    res = _run("experiments.main_job_seeds", "--seeds=0", f"--out={tmp_path / 'out'}",
               "--extra=config.pipo.window=abc")
    _one_line_error(res, "seed 0: the main job refused its flags: error: flag --config.pipo.window=abc")
    res = _run("experiments.main_job_seeds", "--seeds=0-2", "--collect_only", f"--out={tmp_path / 'none'}")
    _one_line_error(res, "--collect_only: no finished run", f"--out={tmp_path / 'none'}")


# ----------------------------------------------------------------------------- a disk that refuses writes

_TRAIN = ("experiments.train", "--config=configs/grpo.py:micro", "--config.warmup.enabled=false",
          "--config.log.progress=false", "--config.checkpoint.export_hf=false")


def test_a_read_only_workdir_is_one_line_naming_the_path(tmp_path):
    from tests import disk

    with disk.tmpfs(tmp_path / "fs") as fs:
        (fs / "run").mkdir()
        disk.read_only(fs)
        res = _run(*_TRAIN, f"--workdir={fs / 'run'}")
        _one_line_error(res, f"error: {fs / 'run' / '.lock'}: read-only file system (no checkpoint in ",
                        "rerun the same command")
        assert os.listdir(fs / "run") == []


def test_a_full_disk_at_start_is_one_line_naming_the_file(tmp_path):
    from tests import disk

    with disk.tmpfs(tmp_path / "fs", "4k") as fs:  # the lock record fits, config.json does not
        res = _run(*_TRAIN, f"--workdir={fs / 'run'}")
        _one_line_error(res, f"error: {fs / 'run' / 'config.json'}: no space left on device (no checkpoint in ")
        assert not [n for n in os.listdir(fs / "run") if n.endswith(".tmp") or n == "config.json"]


@pytest.mark.slow  # one short training run (~1 min on a loaded 2-core CPU)
def test_a_full_disk_at_the_first_save_is_one_line_and_leaves_no_partial_checkpoint(tmp_path):
    from tests import disk

    with disk.tmpfs(tmp_path / "fs", "64k") as fs:  # config and metrics fit, a checkpoint (2 MB) does not
        res = _run(*_TRAIN, "--config.iterations=1", f"--workdir={fs / 'run'}")
        _one_line_error(res, f"error: {fs / 'run' / 'checkpoints' / '1'}: no space left on device (no checkpoint in ")
        assert os.listdir(fs / "run" / "checkpoints") == []  # no `1.orbax-checkpoint-tmp`
        assert json.loads((fs / "run" / "config.json").read_text())["iterations"] == 1


# ----------------------------------------------------------------------------- a workdir's odd files

_NO_WARMUP = ("experiments.train", "--config=configs/grpo.py:micro", "--config.warmup.enabled=false")


@pytest.mark.parametrize("name", [".lock", "config.json", "metrics.jsonl"])
def test_a_fifo_in_a_run_files_place_is_one_line_never_a_hang(tmp_path, name):
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / name)  # nobody writes to it: a blocking open or read would wait forever
    # The warm-up on: the run's files are checked before it (the metrics file is first opened after it).
    res = run_script("-m", "experiments.train", "--config=configs/grpo.py:micro", f"--workdir={run}", env=_ENV,
                     timeout=120)
    _one_line_error(res, f"error: {run / name}: a FIFO, not a regular file (the run reads and writes only regular "
                         "files there): move it aside")
    assert os.listdir(run) == [name]  # nothing written, the FIFO left as it was


@pytest.mark.parametrize("text,what", [("[1, 2]", "a JSON list"), ("null", "a JSON null"),
                                       ("[" * 100_000 + "]" * 100_000, "nested too deep to parse")])
def test_a_stored_config_that_is_no_json_object_is_one_line(tmp_path, text, what):
    (tmp_path / "config.json").write_text(text)
    res = _run(*_NO_WARMUP, f"--workdir={tmp_path}")
    _one_line_error(res, f"error: {tmp_path / 'config.json'}: not a config JSON ({what}", "move it aside to resume")
    assert (tmp_path / "config.json").read_text() == text


def test_a_file_where_the_checkpoints_belong_is_one_line(tmp_path):
    (tmp_path / "checkpoints").write_text("notes")
    res = _run(*_NO_WARMUP, f"--workdir={tmp_path}")
    _one_line_error(res, f"error: {tmp_path / 'checkpoints'}: a regular file, not a directory (the run keeps its "
                         "checkpoints there): move it aside")
    assert sorted(os.listdir(tmp_path)) == ["checkpoints"] and (tmp_path / "checkpoints").read_text() == "notes"


def test_a_seed_past_64_bits_is_refused_by_check_config():
    res = _run("experiments.train", "--config=configs/grpo.py:micro", f"--config.seed={2**64 + 1}", "--check_config")
    _one_line_error(res, f"error: config.seed: {2**64 + 1} must be in [{-2**63}, {2**63 - 1}]")
    res = _run("experiments.train", "--config=configs/grpo.py:micro", f"--config.seed={2**63 - 1}", "--check_config")
    assert res.returncode == 0, res.stderr[-2000:]


@pytest.mark.parametrize("flag,line", [
    ("--slots=0", "--slots=0: must be >= 1"), ("--top_p=0", "--top_p=0.0: must be in (0, 1]"),
    ("--max_new_tokens=-3", "--max_new_tokens=-3: must be >= 1"),
    ("--temperature=nan", "--temperature=nan: must be a finite number >= 0"),
    ("--temperature=-1", "--temperature=-1.0: must be a finite number >= 0")])
def test_serve_refuses_a_setting_no_sampler_takes_before_loading_anything(tmp_path, flag, line):
    # The policy does not exist: the flags are refused before anything is loaded (and without the [serve] extra).
    _one_line_error(_run("experiments.serve", f"--policy={tmp_path / 'none'}", flag), f"error: {line}")
    if not flag.startswith("--slots"):
        _one_line_error(_run("experiments.chat", f"--policy={tmp_path / 'none'}", flag), f"error: {line}")


def test_a_damaged_gzip_or_a_row_nested_too_deep_is_one_error_naming_the_file(tmp_path):
    import gzip

    whole = gzip.compress(b'{"problem": "1+1", "answer": "2"}\n' * 2000)
    (tmp_path / "cut.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "plain.jsonl.gz").write_bytes(b'{"problem": "1+1", "answer": "2"}\n')
    (tmp_path / "garbled.jsonl.gz").write_bytes(whole[:10] + b"\xff" * 64 + whole[74:])
    (tmp_path / "deep.jsonl").write_text('{"problem": "1+1", "answer": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    cases = {"cut.jsonl.gz": r":\d+: not a readable gzip file \(EOFError: Compressed file ended",
             "plain.jsonl.gz": r":1: not a readable gzip file \(BadGzipFile: Not a gzipped file",
             "garbled.jsonl.gz": r":1: not a readable gzip file \(error: Error -3 while decompressing data",
             "deep.jsonl": r":1: invalid JSON \(nested too deep to parse\)$"}
    for name, pattern in cases.items():
        with pytest.raises(DataError, match=f"^{tmp_path / name}{pattern}"):
            load_examples(SourceConfig(str(tmp_path / name)))
