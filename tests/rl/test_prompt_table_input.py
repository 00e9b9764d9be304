"""A dataset task's prompt table is an argument of the compiled rollout, not a constant in it."""

import re

import jax
import numpy as np

from pipo_jax.models import hf
from pipo_jax.rl import loop, rollout
from pipo_jax.tasks import dataset
from tests.rl.test_dataset_task import math_config, math_file, model_dir  # noqa: F401 (fixtures)
from tests.typed import spec_of


def test_generate_takes_the_prompt_table_as_an_argument(model_dir, math_file):  # noqa: F811
    spec = spec_of(math_config(model_dir, math_file))
    _, params = hf.load(model_dir)
    table = rollout.prompt_table(spec)
    n, p = table.tokens_np.shape
    key = jax.random.PRNGKey(3)

    text = loop._host_generate.lower(spec, params, table, key, 2).as_text()
    table_type = f"tensor<{n}x{p}xi32>"
    main_args = re.search(r"func\.func public @main\((.*?)\)\s*->", text, re.S).group(1)
    assert table_type in main_args  # an input of the program
    assert not re.search(r"stablehlo\.constant dense<.*> : " + re.escape(table_type), text)  # not baked in

    # The same compiled program serves another table of the same shapes: rows reversed.
    other = dataset.PromptTable(tokens_np=table.tokens_np[::-1], lengths_n=table.lengths_n[::-1],
                                train_rows=table.train_rows, heldout_rows=table.heldout_rows)
    first = loop._host_generate(spec, params, table, key, 2)
    traces = loop._host_generate._cache_size()
    second = loop._host_generate(spec, params, other, key, 2)
    assert loop._host_generate._cache_size() == traces  # no retrace, no recompile
    np.testing.assert_array_equal(first.problems.index_b, second.problems.index_b)  # same rows drawn
    rows = np.asarray(first.problems.index_b)
    np.testing.assert_array_equal(first.problems.prompt_tokens_bp, np.asarray(table.tokens_np)[rows])
    np.testing.assert_array_equal(second.problems.prompt_tokens_bp, np.asarray(other.tokens_np)[rows])
    assert not np.array_equal(first.tokens_bl[:, :p], second.tokens_bl[:, :p])
