"""The reasoning-gym study's datasets, chosen before its runs (experiments/rg_study.py): ten from at
least four of the library's categories, each config sizing its problems so most rows fit the
character model, all under one recipe."""

import json

import pytest

from experiments import rg_study


def test_ten_datasets_from_four_categories_one_recipe():
    assert len(rg_study.DATASETS) == 10 and len({d.name for d in rg_study.DATASETS}) == 10
    assert len({d.category for d in rg_study.DATASETS}) >= 4
    for d in rg_study.DATASETS:
        argv = rg_study.compare_argv(d, "out")
        sets = [a[len("--set="):] for a in argv if a.startswith("--set=")]
        # the recipe, then only the dataset's name and its own (size) config
        assert sets == [*rg_study.RECIPE, f"task.reasoning_gym.dataset={d.name}",
                        "task.reasoning_gym.config=" + json.dumps(d.config, separators=(",", ":"))]
        assert "--algorithms=grpo" in argv and f"--seeds={rg_study.SEEDS}" in argv


def test_each_config_is_its_category_and_most_rows_fit_the_character_model():
    pytest.importorskip("reasoning_gym", reason="reasoning-gym is an optional extra: pip install -e \".[rg]\"")
    from reasoning_gym.factory import DATASETS

    from pipo_jax.data import text_vocab
    from pipo_jax.tasks import reasoning_gym as rgt

    for d in rg_study.DATASETS:
        assert DATASETS[d.name][0].__module__.split(".")[1] == d.category, d.name
        source = rgt.generate_entries(d.name, d.config, 200, 0, 0.1)
        prompts = rgt.compact_questions([e["question"] for e in source.entries])
        fit = [0 < len(p) <= 48 and len(str(e["answer"])) <= 8 and text_vocab.unknown_char(p) is None
               and text_vocab.unknown_char(str(e["answer"])) is None for p, e in zip(prompts, source.entries)]
        assert sum(fit) >= 0.4 * len(fit), (d.name, sum(fit), len(fit))
