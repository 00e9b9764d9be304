"""The digit-sum task (`pipo_jax/tasks/digit_sum.py`, docs/extending.md "Add a task"): prompts and
answers by hand, the split against the enumeration, the reward through the trainer's path, its two
keys (`config.task.digit_sum.*`: errors naming them, `--check_config` listing them), and a short run."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import grpo, sdpo
from pipo_jax.data import char_vocab
from pipo_jax.rl import rollout
from pipo_jax.config.sections import ConfigError
from pipo_jax.tasks import digit_sum as ds
from tests.conftest import override
from tests.scripts import run_script
from tests.typed import spec_of, train_config

ROOT = pathlib.Path(__file__).resolve().parents[2]
TASK = ds.DigitSumTask()  # 0..999, 100 held out


def config(base=grpo, **overrides):
    c = base.get_config("micro")
    c.task.name = "digit_sum"
    c.warmup.steps = 2
    return override(c, overrides)


def texts(tokens_ba, mask_ba):
    return [char_vocab.decode(np.asarray(t)[np.asarray(m) == 1]) for t, m in zip(tokens_ba, mask_ba)]


def test_prompts_and_answers_by_hand():
    p = TASK.problems_of(np.asarray([0, 7, 45, 100, 19, 999]))
    assert (TASK.prompt_len, TASK.answer_len) == (5, 3)  # <bos> 3 digits '='; "27" <eos>
    assert texts(p.prompt_tokens_bp, p.prompt_mask_bp) == ["<bos>0=", "<bos>7=", "<bos>45=", "<bos>100=", "<bos>19=",
                                                           "<bos>999="]
    d0 = char_vocab.DIGIT0_ID
    np.testing.assert_array_equal(p.prompt_tokens_bp[2], [char_vocab.PAD_ID, char_vocab.BOS_ID, d0 + 4, d0 + 5,
                                                          char_vocab.EQUALS_ID])
    ref = TASK.reference_responses(p)
    assert texts(*ref) == ["0<eos>", "7<eos>", "9<eos>", "1<eos>", "10<eos>", "27<eos>"]
    np.testing.assert_array_equal(ref[0][:3], [[char_vocab.DIGIT0_ID, char_vocab.EOS_ID, char_vocab.PAD_ID],
                                               [char_vocab.DIGIT0_ID + 7, char_vocab.EOS_ID, char_vocab.PAD_ID],
                                               [char_vocab.DIGIT0_ID + 9, char_vocab.EOS_ID, char_vocab.PAD_ID]])
    np.testing.assert_array_equal(ref[1][np.asarray([0, 5])], [[1, 1, 0], [1, 1, 1]])
    five = ds.DigitSumTask(min_digits=2, max_digits=5)
    q = five.problems_of(np.asarray([99999, 10, 12345]))
    assert (five.prompt_len, five.answer_len) == (7, 3)
    assert texts(q.prompt_tokens_bp, q.prompt_mask_bp) == ["<bos>99999=", "<bos>10=", "<bos>12345="]
    assert texts(*five.reference_responses(q)) == ["45<eos>", "1<eos>", "15<eos>"]
    one = ds.DigitSumTask(max_digits=1)  # sums 0..9: one digit and <eos>
    assert (one.prompt_len, one.answer_len) == (3, 2)


def test_every_number_once_and_the_splits_disjoint():
    t = TASK.prompt_table()
    train, held = set(t.train_n.tolist()), set(t.heldout_n.tolist())
    assert len(held) == 100 and len(train) == 900 == TASK.train_size and train | held == set(range(1000))
    assert not train & held
    two = ds.DigitSumTask(min_digits=2, max_digits=3).prompt_table()  # 10..999: 990 numbers, 99 held out
    assert set(two.train_n.tolist()) | set(two.heldout_n.tolist()) == set(range(10, 1000)) and len(two.heldout_n) == 99
    assert set(ds.DigitSumTask(split_seed=1).prompt_table().heldout_n.tolist()) != held
    assert len(ds.DigitSumTask(heldout_fraction=0.0).prompt_table().heldout_n) == 1  # at least one held out
    # sampling stays in its split; the held-out problems are the same every time (with or without the table)
    table = jax.device_put(t)
    drawn = jax.jit(TASK.sample_problems, static_argnums=(2, 3))(table, jax.random.PRNGKey(0), 512, "train")
    assert set(np.asarray(drawn.number_b).tolist()) <= train
    drawn = TASK.sample_problems(None, jax.random.PRNGKey(1), 256, "heldout")
    assert set(np.asarray(drawn.number_b).tolist()) <= held
    np.testing.assert_array_equal(TASK.heldout_problems(table, 8, None).number_b, t.heldout_n[:8])
    np.testing.assert_array_equal(TASK.heldout_problems(None, 8, None).number_b, t.heldout_n[:8])
    # every reference response scores 1.0
    every = TASK.problems_of(np.arange(1000))
    np.testing.assert_array_equal(TASK.reward(every, *TASK.reference_responses(every)), 1.0)


def responses(texts_, width, eos=True):
    tokens = np.full((len(texts_), width), char_vocab.PAD_ID, np.int32)
    mask = np.zeros_like(tokens)
    for i, text in enumerate(texts_):
        ids = char_vocab.encode(text) + ([char_vocab.EOS_ID] if eos else [])
        tokens[i, :len(ids)], mask[i, :len(ids)] = ids, 1
    return tokens, mask


def test_reward_by_hand_through_the_trainers_path():
    spec = spec_of(config())
    assert spec.task == TASK and spec.rollout.max_new_tokens == 3
    numbers = [45, 45, 45, 45, 999, 999, 19, 0]
    answers = ["9", "09", "18", "99", "27", "72", "10", "0"]
    expected = [1, 0, 0, 0, 1, 0, 1, 1]  # "09": a leading zero is wrong; "27<eos>" fills the width 3
    tokens, mask = responses(answers, spec.rollout.max_new_tokens)
    problems = spec.task.problems_of(np.asarray(numbers))
    batch = rollout.from_generation(problems, jnp.asarray(tokens), jnp.asarray(mask), jnp.zeros(tokens.shape))
    got = np.asarray(jax.jit(rollout.task_rewards, static_argnums=0)(spec, batch))
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(spec.task.scorer().score(problems, tokens, mask).rewards_b, expected)
    no_eos = spec.task.reward(problems, *map(jnp.asarray, responses(["9"], 3, eos=False)))
    np.testing.assert_array_equal(no_eos[:1], [0.0])  # an unfinished response scores 0
    wide = responses(["9", "27"], 6)  # rollout.max_new_tokens wider than the answer
    np.testing.assert_array_equal(spec.task.reward(spec.task.problems_of(np.asarray([45, 999])), *wide), [1, 1])


def test_its_two_keys_are_read_and_their_errors_name_them():
    assert spec_of(config(**{"task.digit_sum.min_digits": 2, "task.digit_sum.max_digits": 4,
                                "task.split_seed": 3})).task == ds.DigitSumTask(2, 4, 0.1, 3)
    for overrides, message in [
        ({"task.digit_sum.min_digits": 0}, r"^config\.task\.digit_sum\.min_digits: 0 must be in \[1, 5\]$"),
        ({"task.digit_sum.max_digits": 6}, r"^config\.task\.digit_sum\.max_digits: 6 must be in \[1, 5\]$"),
        ({"task.digit_sum.min_digits": 3, "task.digit_sum.max_digits": 2},
         r"^config\.task\.digit_sum\.min_digits: 3 > task\.digit_sum\.max_digits=2$"),
    ]:
        with pytest.raises(ConfigError, match=message):
            spec_of(config(**overrides))
    with pytest.raises(ConfigError, match=r"^config\.algorithm: sdpo needs teacher contexts .* the digit_sum task"):
        spec_of(config(sdpo))


def test_check_config_lists_its_two_keys():
    res = run_script("-m", "experiments.train", "--config=configs/grpo.py:micro", "--config.task.name=digit_sum",
                     "--config.task.digit_sum.max_digits=4", "--check_config")
    assert res.returncode == 0, res.stderr[-2000:]
    out = res.stdout.splitlines()
    own = [line for line in out if line.startswith("task.digit_sum.")]
    assert own == ["task.digit_sum.min_digits = 1  # fewest digits of N (1: N may be 0..9)",
                   "task.digit_sum.max_digits = 4  # most digits of N (<= 5: every number is a problem, 10**max_digits "
                   "of them at most)"]


@pytest.mark.slow
def test_short_run_with_warmup(tmp_path):
    out = train_config(config(), str(tmp_path / "run"))
    assert out["state"].step == 3 and 0.0 <= out["final_accuracy"] <= 1.0
