"""The sweep engine's pieces without running a program: grids (experiments/hyper_grid.py), points
validated and grouped by jit-static spec, stored results read back or set aside (experiments/study.py),
the report's numbers (experiments/study_report.py) and the launchers' command lines (experiments/sweep.py)."""

import dataclasses
import json
import os

import numpy as np
import pytest

from configs import grpo as grpo_configs
from experiments import cli, hyper_grid, stats, study, study_report
from pipo_jax.config.sections import RunConfig
from pipo_jax.run.setup import train_spec
from tests.typed import spec_of


def test_product_zip_and_sweep_build_the_grid():
    h = hyper_grid
    assert h.sweep("config.pipo.lam", [0.1, 0.2]) == [{"pipo.lam": 0.1}, {"pipo.lam": 0.2}]
    assert h.product([h.sweep("a", [1, 2]), h.sweep("b", ["x", "y"])]) == [
        {"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 2, "b": "x"}, {"a": 2, "b": "y"}]
    assert h.zip([h.sweep("a", [1, 2]), h.sweep("b", ["x", "y"])]) == [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]
    # a zip inside a product: (lr, warm-up) pairs at every lam
    assert h.product([h.sweep("lam", [0, 1]), h.zip([h.sweep("lr", [1, 2]), h.sweep("w", [3, 4])])]) == [
        {"lam": 0, "lr": 1, "w": 3}, {"lam": 0, "lr": 2, "w": 4},
        {"lam": 1, "lr": 1, "w": 3}, {"lam": 1, "lr": 2, "w": 4}]
    assert h.from_flags(["pipo.lam=0.05,0.1", "train.lr=1e-4"], "product") == [
        {"pipo.lam": "0.05", "train.lr": "1e-4"}, {"pipo.lam": "0.1", "train.lr": "1e-4"}]
    assert h.from_flags([], "product") == [{}]
    with pytest.raises(ValueError, match=r"zip: the axes have different lengths \[2, 1\]"):
        h.from_flags(["a=1,2", "b=3"], "zip")
    with pytest.raises(ValueError, match="key 'a' is set by two axes"):
        h.product([h.sweep("a", [1]), h.sweep("config.a", [2])])
    with pytest.raises(ValueError, match=r"--sweep=pipo.lam: expected KEY=VALUE\[,VALUE...\]"):
        h.parse_axis("pipo.lam")


def test_the_example_study_is_4_lams_by_2_lrs():
    from experiments.sweep import study_grid

    grid = study_grid("experiments/studies/pipo_lam_lr.py")
    assert len(grid) == 8 and {g["pipo.lam"] for g in grid} == {0.05, 0.1, 0.2, 0.4}
    assert {g["train.lr"] for g in grid} == {1e-4, 3e-4}


def test_group_indices_group_equal_keys_in_order_of_first_appearance():
    assert study.group_indices(["a", "b", "a", "c", "b"]) == [[0, 2], [1, 4], [3]]
    spec = spec_of(grpo_configs.get_config("micro"))
    other = dataclasses.replace(spec, pipo=dataclasses.replace(spec.pipo, window=4))
    same = dataclasses.replace(spec)  # an equal spec built apart
    assert same is not spec and same == spec and hash(same) == hash(spec)
    assert study.group_indices([spec, other, same]) == [[0, 2], [1]]


def test_points_group_by_their_jit_static_spec():
    """Seeds of one point share a program; a changed window K (a shape) does not; two points group exactly
    when their `train_spec`s are equal (today `pipo.lam` is jit-static; once it is data they share one)."""
    base = grpo_configs.get_config("micro")
    base.pipo.enabled = True
    grid = hyper_grid.product([hyper_grid.sweep("pipo.window", [2, 4]), hyper_grid.sweep("pipo.lam", [0.1, 0.2])])
    points = study.make_points(base, grid, [0, 1])
    assert [p.name for p in points][:3] == ["pipo.window=2,pipo.lam=0.1/seed0", "pipo.window=2,pipo.lam=0.1/seed1",
                                            "pipo.window=2,pipo.lam=0.2/seed0"]
    groups = study.group_points(points)
    specs = {p.name: train_spec(p.config) for p in points}
    group_of = {p.name: i for i, g in enumerate(groups) for p in g}
    for p in points:
        for q in points:
            assert (group_of[p.name] == group_of[q.name]) == (specs[p.name] == specs[q.name]), (p.name, q.name)
    # the seeds of a point always share one program; a window K of its own never does
    assert all(len({group_of[p.name] for p in points if p.label == lab}) == 1 for lab in {p.label for p in points})
    assert all(len({p.config.pipo.window for p in g}) == 1 for g in groups)
    assert [[p.name for p in g] for g in groups][0] == ["pipo.window=2,pipo.lam=0.1/seed0",
                                                        "pipo.window=2,pipo.lam=0.1/seed1"] + (
        ["pipo.window=2,pipo.lam=0.2/seed0", "pipo.window=2,pipo.lam=0.2/seed1"]
        if specs[points[0].name] == specs[points[2].name] else [])  # lam as data: both lams in one program


def test_a_bad_point_is_one_line_naming_the_point_and_key(capsys):
    base = grpo_configs.get_config("micro")
    with pytest.raises(cli.UsageError, match=r"^sweep point pipo.lam=abc \(seed 1\): 'pipo.lam=abc': pipo.lam is a "
                                             r"float"):
        study.make_points(base, [{"pipo.lam": 0.1}, {"pipo.lam": "abc"}], [1])
    with pytest.raises(cli.UsageError, match=r"^sweep point train.mini_batch_prompts=3 \(seed 0\): .*"
                                             r"train.mini_batch_prompts.*does not divide"):
        study.make_points(base, [{"train.mini_batch_prompts": 3}], [0])
    with pytest.raises(cli.UsageError, match=r"sweep point pipo.nope=1 \(seed 0\): .*config has no key 'pipo.nope'"):
        study.make_points(base, [{"pipo.nope": 1}], [0])
    # a point equal to an earlier one (here: the base's own lam) is dropped, counted and named
    points = study.make_points(base, [{}, {"pipo.lam": base.pipo.lam}, {"pipo.lam": 0.3}], [0])
    assert [p.name for p in points] == ["base/seed0", "pipo.lam=0.3/seed0"]
    assert "1 sweep point(s) dropped" in capsys.readouterr().out
    assert study.config_diff(RunConfig.from_config(base), points[1].config) == {"pipo.lam": [base.pipo.lam, 0.3]}


def _entry(point, commit, final):
    row = {"final_accuracy": final, "reward_auc": 0.5, "acc_steps": [0, 2], "accuracy": [0.0, final]}
    return {"label": point.label, "seed": point.seed, "overrides": point.overrides,
            "config": study.fingerprint(point.config), "code": commit, "result": row,
            "group": {"size": 1, "wall_s": 1.0, "compile_s": 0.5}}


def test_stored_points_are_read_back_only_for_the_same_config_and_code(tmp_path, capsys):
    base = grpo_configs.get_config("micro")
    a, b = study.make_points(base, [{"pipo.lam": 0.1}, {"pipo.lam": 0.2}], [0])
    commit = "0" * 40
    path = study.group_file(str(tmp_path), [a.name, b.name])
    os.makedirs(os.path.dirname(path))
    stale_b = _entry(b, commit, 0.7)
    stale_b["config"]["pipo"]["window"] = 99  # stored by a run of another config
    with open(path, "w") as f:
        json.dump({"points": {a.name: _entry(a, commit, 0.5), b.name: stale_b}}, f)
    found = study.stored_points(str(tmp_path), [a, b], commit)
    assert list(found) == [a.name] and found[a.name]["result"]["final_accuracy"] == 0.5
    assert f"{b.name}: stored in {path} with another config (differs in pipo.window); rerun" in capsys.readouterr().out
    # the stale entry is set aside, the good one kept in place
    assert list(json.load(open(path))["points"]) == [a.name]
    (aside,) = os.listdir(tmp_path / "groups" / "stale")
    assert list(json.load(open(tmp_path / "groups" / "stale" / aside))["points"]) == [b.name]
    # other code (or a dirty tree) is never the same code
    assert study.stored_points(str(tmp_path), [a, b], commit + "+dirty") == {}
    assert "by other code" in capsys.readouterr().out
    assert not study.same_code("unknown", "unknown") and study.same_code(commit, commit)
    # an edited tree is known by its sources' hash: the same sources, the same code
    edited = study.code_version(commit + "+dirty")
    assert edited.startswith(commit + "+dirty:") and edited == study.code_version(commit + "+dirty")
    assert study.same_code(edited, edited) and study.code_version(commit) == commit


def test_a_stored_point_is_read_back_only_for_the_members_form_it_was_computed_with(tmp_path, capsys):
    """A point computed with --members=vmap (or stored before the choice existed: vmapped) is not what a
    --members=map study asks for (bit-equal to its separate run): it is set aside and rerun, and the reverse."""
    base = grpo_configs.get_config("micro")
    a, b = study.make_points(base, [{"pipo.lam": 0.1}, {"pipo.lam": 0.2}], [0])
    commit = "0" * 40
    path = study.group_file(str(tmp_path), [a.name, b.name])
    os.makedirs(os.path.dirname(path))
    mapped = dict(_entry(b, commit, 0.7), members="map")
    with open(path, "w") as f:  # a: stored before the choice existed (no "members")
        json.dump({"points": {a.name: _entry(a, commit, 0.5), b.name: mapped}}, f)
    assert list(study.stored_points(str(tmp_path), [a, b], commit, "map")) == [b.name]
    assert f"{a.name}: stored in {path} with --members=vmap (now map); rerun" in capsys.readouterr().out
    assert study.stored_points(str(tmp_path), [a, b], commit, "vmap") == {}  # b was mapped
    assert f"{b.name}: stored in {path} with --members=map (now vmap); rerun" in capsys.readouterr().out


@pytest.mark.slow  # the micro trainer compiled mapped and alone
def test_mapped_members_are_bit_equal_to_their_separate_runs():
    """--members=map: each member of the group's one program is computed as its separate run computes it, so
    params, optimizer state and every metric equal `loop.scan_chunk` alone, bit for bit, over a run long
    enough for the PI step to apply (batched members agree with it only up to the float32 order of their sums:
    tests/test_compare.py), and the evaluations equal the trainer's."""
    import jax

    from experiments import vmapped
    from pipo_jax.models import qwen3
    from pipo_jax.rl import loop
    from pipo_jax.rl.state import init_train_state
    from pipo_jax.run import teacher_forcing, trainer

    c = grpo_configs.get_config("micro")
    c.pipo.enabled = True
    spec = spec_of(c)
    seeds = [0, 1]
    bases = [qwen3.init_params(spec.model, jax.random.PRNGKey(10 + s)) for s in seeds]
    together, m_together = vmapped.vmapped_chunk(
        spec, vmapped.stack([init_train_state(spec, p, s) for p, s in zip(bases, seeds)]), 12, "map")
    accuracy = vmapped.vmapped_accuracy(spec, together.params, 64, "none", "map")
    rewards = vmapped.vmapped_sampled_rewards(spec, together.params, 64, 2, "map")
    eval_key, table = jax.random.PRNGKey(trainer.EVAL_SEED), spec.task.prompt_table()
    alone_accuracy = jax.jit(lambda p: teacher_forcing.heldout_accuracy(spec.model, p, spec.task, table, 64,
                                                                        eval_key))
    alone_rewards = jax.jit(lambda p: trainer.device_sampled_rewards(spec, p, 64, 2))
    for i, (p, s) in enumerate(zip(bases, seeds)):
        alone, m_alone = loop.scan_chunk(spec, init_train_state(spec, p, s), 12)
        assert int(m_alone["pi_step_applied"].sum()) > 0
        member = jax.tree.map(lambda x: x[i], jax.device_get(together))
        assert all(jax.tree.leaves(jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), member,
                                                jax.device_get(alone))))
        for name, value in m_alone.items():
            np.testing.assert_array_equal(m_together[name][i], value, err_msg=name)
        assert float(accuracy[i]) == float(alone_accuracy(alone.params))
        np.testing.assert_array_equal(rewards[i], alone_rewards(alone.params))


def test_heldout_auc_and_the_paired_summary():
    row = {"final_accuracy": 0.75, "reward_auc": 0.5, "acc_steps": [0, 10, 20, 25], "accuracy": [0.2, 0.3, 0.6, 0.75]}
    assert study_report.point_metrics(row) == {"final_accuracy": 0.75, "reward_auc": 0.5,
                                               "heldout_auc": pytest.approx(0.55)}  # the evaluations after 0
    rows = [{"label": lab, "seed": s, "overrides": {}, "metrics": {"final_accuracy": v, "reward_auc": v / 2,
                                                                  "heldout_auc": v}}
            for lab, vals in (("base", [0.1, 0.2, 0.3]), ("x", [0.3, 0.5, 0.4])) for s, v in enumerate(vals)]
    s = study_report.summarise(rows, "base")
    assert s["metrics"] == ["final_accuracy", "reward_auc", "heldout_auc"]  # pass@1 only where every row has it
    assert s["per_label"]["final_accuracy"]["x"]["mean"] == pytest.approx(0.4)
    assert s["per_label"]["final_accuracy"]["x"]["ci95"] == list(stats.bootstrap_mean_ci([0.3, 0.5, 0.4]))
    d = s["vs_baseline"]["final_accuracy"]["x"]
    np.testing.assert_allclose(d["diffs"], [0.2, 0.3, 0.1])
    assert d["wilcoxon_p"] == 0.25 and d["seeds"] == [0, 1, 2]  # 3 positive pairs: exact p = 2 / 2**3
    one = study_report.paired({0: 0.5}, {0: 0.25, 1: 0.0})
    assert (one["n"], one["mean"], one["ci95"], one["wilcoxon_p"]) == (1, 0.25, None, None)
    table = study_report.format_tables(s)
    assert "| x | 3 | 0.400 [" in table and "+0.200 [" in table and "p = 0.25 |" in table
    assert "| base | 3 | 0.200 [" in table and "(baseline) |" in table


def test_the_slurm_array_runs_one_group_per_task():
    from experiments import schedule

    argv = ["--config=configs/grpo.py:micro", "--sweep=pipo.window=2,4", "--workers=2", "--emit_slurm=x.sbatch",
            "--slurm_option=--gpus-per-task=1", "--seeds=0-2"]
    assert schedule.child_argv(argv, group_index=3) == ["--config=configs/grpo.py:micro", "--sweep=pipo.window=2,4",
                                                        "--seeds=0-2", "--group_index=3"]
    text = schedule.slurm_script("experiments.sweep", argv, 4, "/tmp/out", ["--gpus-per-task=1"])
    assert "#SBATCH --array=0-3\n" in text and "#SBATCH --gpus-per-task=1\n" in text
    assert "#SBATCH --job-name=pipo_sweep\n" in text
    assert "-m experiments.sweep --config=configs/grpo.py:micro --sweep=pipo.window=2,4 --seeds=0-2 " \
           "--group_index=\"${SLURM_ARRAY_TASK_ID}\"" in text
    assert "--workers" not in text and "--emit_slurm" not in text


@pytest.mark.slow  # a vmapped group of two seeds and the trainer alone, each compiled once
def test_a_group_equals_its_separate_runs_and_is_read_back_not_rerun(tmp_path, monkeypatch):
    """The seeds of one point run as one vmapped program (`study.run_points`) give each seed's separate
    trainer run (`experiments.runs.run` from the same base: the main job's RL part): the same batch
    rewards and held-out accuracies. The stored group is then read back, never rerun."""
    from experiments import runs

    base = grpo_configs.get_config("micro")
    base.pipo.enabled, base.iterations = True, 2
    points = study.make_points(base, [{"pipo.lam": 0.2}], [0, 1])
    (group,) = study.group_points(points)
    commit = "0" * 40
    entries = study.run_points(group, str(tmp_path), lambda p: study.base_of(p, str(tmp_path / "bases")), commit)
    assert [e["group"]["size"] for e in entries.values()] == [2, 2]
    assert all(0 < e["group"]["compile_s"] < e["group"]["wall_s"] for e in entries.values())
    for p in points:
        alone = runs.run(p.config, str(tmp_path / f"alone{p.seed}"),
                         study.base_of(p, str(tmp_path / "bases")))
        got = entries[p.name]["result"]
        assert got["reward"] == alone["reward"] and got["accuracy"] == alone["accuracy"]
        assert got["acc_steps"] == alone["acc_steps"] == [0, 2] and got["final_accuracy"] == alone["final_accuracy"]
    assert entries[points[0].name]["result"]["reward"] != entries[points[1].name]["result"]["reward"]
    monkeypatch.setattr(study, "run_group_points", lambda *a: pytest.fail("a stored point was rerun"))
    assert study.stored_points(str(tmp_path), points, commit) == json.loads(json.dumps(entries))


def test_group_selection_for_array_tasks_and_tpu_vms():
    from experiments import schedule

    assert schedule.select_groups(5, -1, "") == [0, 1, 2, 3, 4]
    assert schedule.select_groups(5, 3, "") == [3]
    assert schedule.select_groups(5, -1, "1/2") == [1, 3]
    with pytest.raises(cli.UsageError, match=r"--group_index=5: the study has 5 groups \(0-4\)"):
        schedule.select_groups(5, 5, "")
    with pytest.raises(cli.UsageError, match="--group_shard=2/2: expected I/N with 0 <= I < N"):
        schedule.select_groups(5, -1, "2/2")


def test_a_failed_group_is_one_line_and_its_log_survives_the_rerun(tmp_path, monkeypatch):
    """`run_workers`: a group whose process fails is one line naming it and its log; run again, the log
    keeps the failed try's lines above the new try's (each under a line naming its command)."""
    from experiments import schedule

    stand_in = tmp_path / "failing_group.py"  # a study module whose group process prints and exits 3
    stand_in.write_text("import sys\nprint('the first try failed here', sys.argv[1:])\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    log = tmp_path / "out" / "logs" / "group0.log"
    for attempt in (1, 2):
        with pytest.raises(RuntimeError, match=rf"group 0: its process exited with 3; see {log}"):
            schedule.run_workers("failing_group", ["--seeds=0"], [0], 2, str(tmp_path / "out"))
        lines = log.read_text().splitlines()
        assert len(lines) == 2 * attempt
        assert lines[-2].startswith("=== ") and "failing_group --seeds=0 --group_index=0" in lines[-2]
        assert lines[-1] == "the first try failed here ['--seeds=0', '--group_index=0']"


@pytest.mark.parametrize("module", ["", "experiments.compare"])
def test_the_tpu_launcher_gives_each_vm_its_shard(tmp_path, module):
    """experiments/launch/tpu_sweep.sh with a stand-in `gcloud` that records its arguments: a sweep, or the
    study command named before the flags (compare, on the same engine)."""
    import subprocess

    fake = tmp_path / "gcloud"  # each call to its own file: the VMs' calls run at once
    fake.write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$(mktemp {tmp_path}/call.XXXXXX)"\n')
    fake.chmod(0o755)
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "launch",
                          "tpu_sweep.sh")
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}")
    res = subprocess.run(["bash", script, "us-east5-a", "vm-a,vm-b", *filter(None, [module]), "--out=/gcs/runs/x",
                          "--sweep=pipo.lam=0.1,0.2"], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    calls = [p.read_text().splitlines() for p in tmp_path.glob("call.*")]
    assert sorted(c[4] for c in calls) == ["vm-a", "vm-b"]
    for c in calls:
        shard = "0/2" if c[4] == "vm-a" else "1/2"
        assert "--zone=us-east5-a" in c and "--worker=0" in c
        command = " ".join(c[c.index(next(x for x in c if x.startswith("--command="))):])
        # the flags shell-quoted for the VM's shell (printf %q: the comma escaped)
        assert f"python -m {module or 'experiments.sweep'}  --out=/gcs/runs/x --sweep=pipo.lam=0.1\\,0.2 " \
               f"--group_shard={shard}" in command
    res = subprocess.run(["bash", script, "us-east5-a", "vm-a", "experiments.train", "--out=x"], env=env,
                         capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.strip() == ("tpu_sweep.sh: experiments.train: expected "
                                                          "experiments.sweep or experiments.compare before the flags")


def test_reproduce_renders_a_sweep_like_its_other_tables():
    from experiments import reproduce

    rows = [{"label": lab, "seed": s, "overrides": {"pipo.lam": lam},
             "metrics": {"final_accuracy": v, "reward_auc": v, "heldout_auc": v}}
            for lab, lam, vals in (("pipo.lam=0.1", 0.1, [0.5, 0.25]), ("pipo.lam=0.2", 0.2, [0.75, 0.5]))
            for s, v in enumerate(vals)]
    rec = {"json_name": "x.json", "commit": "0123456789abcdef", "cpu_model": "CPU X", "cpu_count": 2,
           "versions": {"jax": "0.10.2"}, "points": rows, "swept_keys": ["pipo.lam"], "seeds": [0, 1],
           "groups": [["a"], ["b"]], "wall_time_s": 100.4, "cpu_time_s": 180.6,
           "summary": study_report.summarise(rows, "pipo.lam=0.1")}
    text = reproduce.render_sweep([rec, {"json_name": "y.json", "missing": True}])
    assert text.startswith("Measured with CPU X, 2 cores, jax 0.10.2: 4 points (pipo.lam x "
                           "seeds 0,1) in 2 programs, 100 s wall / 181 s CPU (JSON: `experiments/results/x.json`).")
    assert "| pipo.lam=0.2 | 2 | 0.625 [" in text and "| +0.250 [+0.250, +0.250], p = 0.5 |" in text
    assert text.endswith("Not run yet (no `experiments/results/y.json`).")
    assert "0123456789ab" not in text  # the JSON cited holds the commit
    assert reproduce.TABLES["sweep_lam_lr"].runs[0].argv[0] == "experiments.sweep"


def test_the_benchmark_checks_a_point_against_its_separate_run(tmp_path):
    """experiments/benchmarks/sweep_vs_separate.py: equal curves and finals are equal; one reward off is not."""
    from experiments.benchmarks import sweep_vs_separate as bench

    rows = [{"step": 0, "heldout_accuracy": 0.25}, {"step": 1, "reward_mean": 0.5}, {"step": 2, "reward_mean": 0.75,
                                                                                       "heldout_accuracy": 0.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "summary.json").write_text(json.dumps({"final_accuracy": 0.5, "final_pass@1": 0.3}))
    result = {"reward": [0.5, 0.75], "acc_steps": [0, 2], "accuracy": [0.25, 0.5], "final_accuracy": 0.5,
              "final_pass_at_1": 0.3}
    check = bench.compare_point({"result": result}, str(tmp_path))
    assert check["equal"] and check["reward_max_abs_diff"] == 0 and check["final_pass_at_1"] == [0.3, 0.3]
    check = bench.compare_point({"result": dict(result, reward=[0.5, 0.5])}, str(tmp_path))
    assert not check["equal"] and check["reward_max_abs_diff"] == 0.25 and check["accuracy_equal"]
