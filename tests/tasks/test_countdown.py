"""The countdown task (`pipo_jax/tasks/countdown.py`, README "Add a task"): the expression check by
hand, the problems and their split against an independent enumeration, the reward through the
trainer's path, the capabilities it declares (config errors naming the key), and a short run."""

import itertools
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import grpo, sdpo
from pipo_jax.data import text_vocab
from pipo_jax.rl import rollout
from pipo_jax.config.sections import ConfigError
from pipo_jax.tasks import countdown as cd
from tests.conftest import override
from tests.typed import spec_of, train_config

TASK = cd.CountdownTask()


def config(base=grpo, **overrides):
    c = base.get_config("micro")
    c.task.name = "countdown"
    c.warmup.steps = 2
    c.task.arithmetic.warmup_mistake_rate, c.task.arithmetic.warmup_context_fraction = 0.0, 0.0
    return override(c, overrides)


@pytest.mark.parametrize("text, value", [
    ("(3+5)*7", 56), ("7*(5+3)", 56), ("3+5*7", 38), ("7-5", 2), ("7/5", Fraction(7, 5)), ("((3))", 3), (" 3 + 5 ", 8),
    ("(3+5)*7+7", None),  # 7 used twice
    ("56", None), ("8*7", None),  # numbers not given
    ("3**5", None), ("-3+5", None), ("7//5", None), ("7%5", None),  # other operators
    ("7/(5-5)", None),  # division by zero
    ("__import__('os')", None), ("abs(3)", None), ("3 if 5 else 7", None), ("1e3", None), ("0x3", None),
    ("(3+5", None), ("", None), ("3+5+7" + " " * 12, None),  # syntax, empty, longer than MAX_EXPRESSION_CHARS
])
def test_expressions_are_checked_by_their_tree_never_run(text, value):
    got = cd.evaluate_expression(text, [3, 5, 7])
    assert got == value if value is not None else got is None


def test_problems_are_every_generated_target_once_and_split_disjointly():
    expected = {(a, b, c, t) for a, b, c in itertools.product(range(1, 10), repeat=3)
                for t in (a + b + c, a * b + c, (a + b) * c, a * b * c)}
    t = TASK.tables
    got = {(*map(int, n), int(x)) for n, x in zip(t.numbers_nk, t.target_n)}
    assert got == expected and len(t.target_n) == len(expected) == 2864
    train, held = set(t.train_rows.tolist()), set(t.heldout_rows.tolist())
    assert not train & held and len(train | held) == 2864 and len(held) == round(0.1 * 2864) == 286
    other = cd.CountdownTask(split_seed=1).tables
    assert set(other.heldout_rows.tolist()) != held
    # row (3, 5, 7) -> 56: its prompt and reference response
    row = next(i for i, (n, x) in enumerate(zip(t.numbers_nk, t.target_n)) if list(n) == [3, 5, 7] and x == 56)
    p = TASK.problems_at(np.asarray([row]))
    prompt = p.prompt_tokens_bp[0][p.prompt_mask_bp[0] == 1]
    assert text_vocab.decode(prompt) == "<bos>3 5 7:56<answer>" and TASK.prompt_len == 16
    ref, ref_mask = TASK.reference_responses(p)
    assert text_vocab.decode(ref[0][ref_mask[0] == 1]) == "(3+5)*7<eos>"
    # sampling stays in its split; held-out problems are the same every time
    drawn = TASK.sample_problems(None, jax.random.PRNGKey(0), 256, "heldout")
    assert set(np.asarray(drawn.index_b).tolist()) <= held
    np.testing.assert_array_equal(TASK.heldout_problems(None, 8, None).index_b, t.heldout_rows[:8])
    # every reference response scores 1.0
    every = TASK.problems_at(np.arange(len(t.target_n)))
    np.testing.assert_array_equal(TASK.score(every.index_b, every.target_tokens_ba, every.target_mask_ba), 1.0)


def responses(texts, width, eos=True):
    tokens = np.full((len(texts), width), text_vocab.PAD_ID, np.int32)
    mask = np.zeros_like(tokens)
    for i, text in enumerate(texts):
        ids = text_vocab.encode(text) + ([text_vocab.EOS_ID] if eos else [])
        tokens[i, :len(ids)], mask[i, :len(ids)] = ids, 1
    return tokens, mask


def test_reward_by_hand_through_the_trainers_path():
    spec = spec_of(config())
    t = spec.task.tables
    row = {(tuple(n), int(x)): i for i, (n, x) in enumerate(zip(t.numbers_nk.tolist(), t.target_n))}
    rows = [row[(3, 5, 7), 56]] * 5 + [row[(2, 4, 8), 16]] * 3
    texts = ["(3+5)*7", "7*(5+3)", "3+5*7", "(3+5)*7+7", "7*8", "8/2*4", "2*4+8", "8/4*2"]
    expected = [1, 1, 0, 0, 0, 1, 1, 0]  # 38; 7 twice; 8 not given; 16, 16 (division); 4
    tokens, mask = responses(texts, spec.rollout.max_new_tokens)
    problems = spec.task.problems_at(np.asarray(rows))
    batch = rollout.from_generation(problems, jnp.asarray(tokens), jnp.asarray(mask), jnp.zeros(tokens.shape))
    got = np.asarray(jax.jit(rollout.task_rewards, static_argnums=0)(spec, batch))
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(spec.task.scorer().score(problems, tokens, mask).rewards_b, expected)
    no_eos = spec.task.score(problems.index_b[:1], *responses(texts[:1], spec.rollout.max_new_tokens, eos=False))
    np.testing.assert_array_equal(no_eos, [0.0])  # an unfinished response scores 0


def test_capabilities_it_lacks_are_config_errors_naming_the_key():
    assert cd.CountdownTask.capabilities.device_reward and not cd.CountdownTask.capabilities.teacher_contexts
    with pytest.raises(ConfigError, match=r"^config\.algorithm: sdpo needs teacher contexts .* the countdown task"):
        spec_of(config(sdpo))
    assert spec_of(config(**{"task.arithmetic.warmup_mistake_rate": 0.5})).task.name == "countdown"  # not its key
    with pytest.raises(ConfigError, match=r"^config\.task: CountdownTask\.heldout_fraction=0\.0 must be in \(0, 1\)"):
        spec_of(config(**{"task.heldout_fraction": 0.0}))
    with pytest.raises(ValueError, match=r"count=5 must be in \[2, 4\]"):
        cd.CountdownTask(count=5)


def test_short_run_with_warmup(tmp_path):
    out = train_config(config(), str(tmp_path / "run"))
    assert out["state"].step == 3 and 0.0 <= out["final_accuracy"] <= 1.0
