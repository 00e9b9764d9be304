"""The results tables of the README and docs are renders of their JSONs (experiments/reproduce.py),
never typed: each marked block equals what `python -m experiments.reproduce NAME --render` writes."""

import json
import os
import subprocess
import sys

import pytest

from experiments import cli, reproduce, rg_study
from pipo_jax import provenance


@pytest.mark.parametrize("name", sorted(reproduce.TABLES))
def test_every_marked_block_is_the_render_of_its_json(name):
    table = reproduce.TABLES[name]
    expected = reproduce.rendered_block(table)
    for doc in table.docs:
        text = (reproduce.ROOT / doc).read_text()
        i, j = reproduce.block(text, name, doc)
        assert text[i:j] == expected, f"{doc}: the {name} table differs from its JSON; run " \
                                      f"`python -m experiments.reproduce {name} --render`"


def test_the_main_job_render_states_each_seed_and_the_machine():
    record = {"json_name": "x.json", "commit": "0123456789abcdef+dirty", "cpu_model": "CPU X", "cpu_count": 2,
              "workers": 2,
              "versions": {"jax": "0.10.2"}, "gain_mean": 0.25, "gain_min": 0.2,
              "runs": [{"seed": 0, "initial_accuracy": 0.5, "final_accuracy": 0.75, "gain": 0.25,
                        "acc_steps": [0, 20, 100], "accuracy": [0.5, 0.625, 0.75],
                        "warmup_teacher_solution_accuracy": 1.0, "warmup_teacher_feedback_accuracy": 0.5,
                        "wall_time_s": 100.4, "cpu_time_s": 90.6},
                       {"seed": 1, "initial_accuracy": 0.4, "final_accuracy": 0.6, "gain": 0.2,
                        "acc_steps": [0, 100], "accuracy": [0.4, 0.6], "warmup_teacher_solution_accuracy": None,
                        "warmup_teacher_feedback_accuracy": None, "wall_time_s": None, "cpu_time_s": None}]}
    text = reproduce.render_main_job([record])
    assert "Measured with CPU X (vector extensions not recorded), 2 cores, jax 0.10.2, 2 runs at a time (JSON: " \
           "`experiments/results/x.json`)" in text
    assert "0123456" not in text and "dirty" not in text  # the commit is the JSON's, not the table's
    with_isa = reproduce.render_main_job([record | {"cpu_isa": ["avx", "avx2", "fma", "sse4_2"]}])
    assert with_isa.startswith("Measured with CPU X (AVX2, FMA), 2 cores, ")
    assert "| 0 | 0.500 | 0.625 | 0.750 | +0.250 | 1.00 / 0.50 | 100 s / 91 s |" in text
    assert "| 1 | 0.400 | - | 0.600 | +0.200 | - | - |" in text
    assert "2 of 2 seeds gain held-out greedy accuracy (mean +0.250, least +0.200) from bases solving 40%-50%." in text


def test_the_main_job_has_a_record_per_cpu_model_and_a_host_makes_its_own(monkeypatch):
    """Each record of the main job renders as its own block under its machine line; a host runs only the
    record of its CPU model, and a model no record has is one line naming the models measured."""
    table = reproduce.TABLES["main_job"]
    models = [r.cpu_model for r in table.runs]
    assert len(set(models)) == len(models) == len({r.json for r in table.runs}) >= 2 and None not in models
    records = reproduce.load_records(table)
    assert [r["cpu_model"] for r in records] == models  # each JSON was measured on its run's CPU model
    text = reproduce.render_main_job(records)
    for rec in records:
        assert f"Measured with {rec['cpu_model']}" in text and f"`experiments/results/{rec['json_name']}`" in text
    assert text.count("| seed | base acc") == len(records)
    assert all(r.cpus == rec["cpu_count"] == 2 for r, rec in zip(table.runs, records))  # measured on 2 cores
    for run in table.runs:
        monkeypatch.setattr(reproduce.provenance, "cpu_model", lambda run=run: run.cpu_model)
        monkeypatch.setattr(reproduce.provenance, "cpu_isa", lambda run=run: run.cpu_isa or ("avx2",))
        monkeypatch.setattr(reproduce.provenance, "schedulable_cpus", lambda: 2)
        assert reproduce.runs_of_this_host(table) == [run]
        # XLA:CPU's thread pool follows the cores the process may use, and its split of a matmul the pool
        # (the AMD EPYC's seed 0: 0.307 -> 0.570 on its 2 cores, 0.434 -> 0.805 pinned to one of them)
        monkeypatch.setattr(reproduce.provenance, "schedulable_cpus", lambda: 8)
        with pytest.raises(cli.UsageError, match="with 2 cores.* and 8 schedulable cores"):
            reproduce.runs_of_this_host(table)
    monkeypatch.setattr(reproduce.provenance, "schedulable_cpus", lambda: 2)
    amd = next(r for r in table.runs if r.cpu_isa)  # the model's name alone is not its record's CPU
    monkeypatch.setattr(reproduce.provenance, "cpu_model", lambda: amd.cpu_model)
    monkeypatch.setattr(reproduce.provenance, "cpu_isa", lambda: tuple(x for x in amd.cpu_isa if "512" not in x))
    with pytest.raises(cli.UsageError, match="not on this host's 'AMD EPYC' with its vector extensions"):
        reproduce.runs_of_this_host(table)
    monkeypatch.setattr(reproduce.provenance, "cpu_model", lambda: "CPU Z")
    with pytest.raises(cli.UsageError, match=r"^main_job: measured on the CPU models 'Intel.*, not on this host's "
                                             r"'CPU Z' with .*`python -m experiments.main_job_seeds --seeds=0-4"):
        reproduce.runs_of_this_host(table)
    assert reproduce.runs_of_this_host(reproduce.TABLES["algorithms"]) == list(reproduce.TABLES["algorithms"].runs)


def test_a_missing_block_or_json_is_one_line(tmp_path, monkeypatch):
    with pytest.raises(cli.UsageError, match="README.md: no <!-- table:x --> ... <!-- /table:x --> block"):
        reproduce.block("no markers here", "x", "README.md")
    monkeypatch.setattr(reproduce, "RESULTS", tmp_path)
    with pytest.raises(cli.UsageError, match="main_job_seeds.json is missing; run `python -m experiments.reproduce"):
        reproduce.load_records(reproduce.TABLES["main_job"])


def test_a_results_json_copied_into_the_checkout_leaves_the_commit_clean(tmp_path):
    """`experiments.reproduce` copies each run's JSON into experiments/results/ before the table's next run:
    that run's commit stays clean; a changed file elsewhere is '+dirty'."""

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "experiments" / "results").mkdir(parents=True)
    (tmp_path / "experiments" / "results" / "a.json").write_text("{}")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "init", "--allow-empty")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "files")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    (tmp_path / "experiments" / "results" / "a.json").write_text('{"run": 1}')
    assert provenance.git_commit(str(tmp_path)) == head
    (tmp_path / "code.py").write_text("x = 2\n")
    assert provenance.git_commit(str(tmp_path)) == head + "+dirty"


def test_the_rg_study_table_shows_every_listed_dataset_run_or_not():
    """Each pre-listed dataset has its rows: measured ones with greedy accuracy, pass@1 where recorded and
    PIPO minus no PIPO; the rest 'not run yet', never left out."""
    measured = json.loads((reproduce.RESULTS / "compare_rg_chain_sum_5seeds.json").read_text())  # no pass@1 in it
    records = [measured | {"json_name": "x.json"}] + [{"json_name": "y.json", "missing": True}] * 9
    text = reproduce.render_rg_study(records)
    assert text.startswith("1 of 10 datasets run, measured with ")
    for d in rg_study.DATASETS[1:]:
        assert f"| `{d.name}` ({d.category}) | not run yet |" in text and f"| `{d.name}` | not run yet |" in text
    a = measured["summary"]["arms"]["grpo+PIPO"]
    assert (f"| `chain_sum` (arithmetic) | grpo+PIPO | 5 | {a['initial_accuracy_mean']:.3f} | "
            f"{a['final_accuracy_mean']:.3f} | ") in text
    assert "| - | - | " in text  # pass@1 not recorded by that run
    assert "| `chain_sum` | +0.011 [-0.016, +0.035], p = 0.625 | 3/5 | - | " in text


def test_every_method_rg_covers_each_method_once_and_the_study_recipe():
    """The groups and the methods left out (with the reason) are every config of `configs/` exactly once;
    each run is the study's compare command of its dataset (recipe, seeds, iterations) with the study's bases."""
    configs = {p.stem for p in (reproduce.ROOT / "configs").glob("*.py")} - {"__init__", "base"}
    grouped = [a for group in reproduce.RG_METHOD_GROUPS for a in group]
    assert len(grouped) == len(set(grouped)) and set(grouped) | set(reproduce.RG_NOT_APPLICABLE) == configs
    assert not set(grouped) & set(reproduce.RG_NOT_APPLICABLE)
    d = rg_study.dataset(reproduce.RG_METHODS_DATASET)
    for run, group in zip(reproduce.TABLES["every_method_rg"].runs, reproduce.RG_METHOD_GROUPS):
        assert run.argv[:6] == ("experiments.compare", f"--algorithms={','.join(group)}", f"--seeds={rg_study.SEEDS}",
                                f"--iterations={rg_study.ITERATIONS}", f"--base_dir=runs/rg_study/{d.name}",
                                *(f"--set={s}" for s in rg_study.recipe_sets(d)[:1]))
        assert [a[len("--set="):] for a in run.argv[5:]] == rg_study.recipe_sets(d)


def test_the_every_method_rg_table_shows_each_method_run_or_not(monkeypatch):
    """A run's methods get their figures (from its JSON), a missing run's methods 'not run yet'; the methods
    the task cannot run are named with the reason."""
    measured = json.loads((reproduce.RESULTS / "compare_methods_a_5seeds.json").read_text())
    monkeypatch.setattr(reproduce, "RG_METHOD_GROUPS", (("rloo", "bnpo"), ("grpo",)))
    text = reproduce.render_every_method_rg([measured | {"json_name": "a.json"}, {"json_name": "b.json", "missing": True}])
    assert text.startswith("1 of 2 runs made, measured with ")
    off, on = measured["summary"]["arms"]["rloo"], measured["summary"]["arms"]["rloo+PIPO"]
    acc = measured["summary"]["pipo_minus_base"]["rloo"]["final_accuracy"]
    higher = sum(x > 0 for x in acc["diffs"])
    assert (f"| rloo | 5 | {off['initial_accuracy_mean']:.3f} | {off['final_accuracy_mean']:.3f} | ") in text
    assert f"| {on['final_accuracy_mean']:.3f} | {reproduce._ci(acc)} | {higher}/5 | " in text
    assert "| grpo | not run yet |" in text and "`b.json` |" in text
    assert text.endswith("no teacher contexts: sdpo (needs teacher contexts); vpd (needs teacher contexts).")


def test_the_both_tasks_table_puts_each_method_of_both_tasks_in_one_row(monkeypatch):
    """A method's built-in cells from the first run that has it, beside its reasoning-gym cells (a run not
    made: 'not run yet'; a method the task cannot run: 'n/a' with the reason); every built-in method is a row."""
    a = json.loads((reproduce.RESULTS / "compare_methods_a_5seeds.json").read_text())
    sdpo = json.loads((reproduce.RESULTS / "compare_grpo_sdpo_10seeds.json").read_text())
    monkeypatch.setattr(reproduce, "_BUILTIN_METHOD_RUNS", (None, None))
    monkeypatch.setattr(reproduce, "RG_METHOD_GROUPS", (("rloo", "bnpo"), ("grpo", "disco", "bapo", "gdpo",
                                                                            "adora", "reinforce_pp")))
    text = reproduce.render_both_tasks([sdpo | {"json_name": "s.json"}, a | {"json_name": "a.json"},
                                        a | {"json_name": "rg1.json"}, {"json_name": "rg2.json", "missing": True}])
    assert text.startswith("Built-in task: 2 comparisons (100 iterations of the `tiny` preset); reasoning-gym "
                           f"`{reproduce.RG_METHODS_DATASET}`: 1 of 2 comparisons made")
    off = a["summary"]["arms"]["rloo"]
    acc = a["summary"]["pipo_minus_base"]["rloo"]["final_accuracy"]
    cells = (f"5 | {off['initial_accuracy_mean']:.3f} | {reproduce._ci(off['gain_over_base'])} | "
             f"{reproduce._ci(acc)} | {sum(x > 0 for x in acc['diffs'])}/5 | ")
    assert f"| rloo | {cells}" in text and text.count(cells) == 2  # the same run stands in for both tasks here
    assert "| sdpo | 10 | " in text and "| n/a: needs teacher contexts |  |  |  |  |  |" in text
    assert "| grpo | 10 | " in text and "| not run yet |  |  |  |  |  |" in text
    assert len([ln for ln in text.splitlines() if ln.startswith("| ") and "---" not in ln]) == 1 + 2 + 7

def test_a_missing_built_in_comparison_stops_the_both_tasks_table_but_a_missing_rg_run_does_not(tmp_path, monkeypatch):
    monkeypatch.setattr(reproduce, "RESULTS", tmp_path)
    table = reproduce.TABLES["both_tasks"]
    for run in table.runs:
        if run.optional:
            continue
        (tmp_path / run.json).write_text("{}")
    assert all(r.get("missing") for r, run in zip(reproduce.load_records(table), table.runs) if run.optional)
    (tmp_path / "compare_methods_b_5seeds.json").unlink()
    with pytest.raises(reproduce.cli.UsageError, match="compare_methods_b_5seeds.json is missing; run"):
        reproduce.load_records(table)


def test_the_vector_extensions_are_named_widest_first():
    amd = reproduce.TABLES["main_job"].runs[1].cpu_isa
    assert reproduce.vector_extensions(amd) == "AVX-512 with BF16 and VNNI, AVX2, FMA"
    assert reproduce.vector_extensions(("amx_tile", "avx512f", "avx2")) == "AMX, AVX-512, AVX2"
    assert reproduce.vector_extensions(("avx", "sse4_2")) == "AVX"
    assert reproduce.vector_extensions(("sse4_1",)) == "no AVX"


def test_the_cpu_isa_is_the_vector_and_matrix_extensions_of_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: CPU X\nflags\t\t: fpu vme sse2 sse4_2 avx2 fma avx512f "
                    "avx512_bf16 amx_tile pni\n")
    assert provenance.cpu_isa(str(info)) == ("amx_tile", "avx2", "avx512_bf16", "avx512f", "fma", "sse4_2")
    assert provenance.cpu_isa(str(tmp_path / "absent")) == ()
    assert provenance.record()["cpu_isa"] == list(provenance.cpu_isa())
    assert provenance.record()["schedulable_cpus"] == len(os.sched_getaffinity(0)) == provenance.schedulable_cpus()


def test_each_tables_time_is_read_from_its_jsons(tmp_path, monkeypatch):
    assert reproduce.record_times({"wall_time_s": 4625.7, "cpu_time_s": 3142.4}) == (4625.7, 3142.4)
    assert reproduce.record_times({"seconds": 792.6, "date": "x"}) == (792.6, None)
    assert reproduce.record_times({"total_wall_time_s": None, "runs": [{"cpu_time_s": 155.0}, {"cpu_time_s": 160.5}]}
                                  ) == (None, 315.5)
    monkeypatch.setattr(reproduce, "RESULTS", tmp_path)
    (tmp_path / "a.json").write_text(json.dumps({"wall_time_s": 4625.7, "cpu_time_s": 3142.4}))
    (tmp_path / "b.json").write_text(json.dumps({"wall_time_s": 60.0, "cpu_time_s": 29.0}))
    runs = (reproduce.Run(("x",), "p", "a.json"), reproduce.Run(("x",), "p", "b.json"),
            reproduce.Run(("x",), "p", "c.json", optional=True))
    table = reproduce.Table("t", runs, str, ())
    # 4685.7 s = 78.1 min; 3171.4 s = 52.9 min; c.json not made yet
    assert reproduce.measured_time(table) == "1 h 18 min wall, 53 min CPU (2 of 3 runs made)"
    per_cpu = reproduce.Table("m", (reproduce.Run(("x",), "p", "a.json", cpu_model="CPU A"),), str, ())
    assert reproduce.measured_time(per_cpu) == "on CPU A: 1 h 17 min wall, 52 min CPU"
    unmade = reproduce.Table("u", (reproduce.Run(("x",), "p", "c.json", optional=True),), str, ())
    assert reproduce.measured_time(unmade) == "not run yet (0 of 1 runs made)"  # no zero-second total


def test_help_exits_0_and_gives_every_tables_measured_time():
    res = subprocess.run([sys.executable, "-m", "experiments.reproduce", "--help"], capture_output=True, text=True,
                         cwd=reproduce.ROOT, timeout=300, env=dict(os.environ, PYTHONPATH=str(reproduce.ROOT)))
    assert res.returncode == 0, res.stderr[-2000:]
    for name, table in reproduce.TABLES.items():
        assert f"  {name}: {reproduce.measured_time(table)}\n" in res.stdout
    # the ablations' JSON: 4,626 s wall, 3,142 s CPU
    assert "  ablations: 1 h 17 min wall, 52 min CPU\n" in res.stdout
