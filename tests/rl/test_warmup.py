"""Supervised warm-up of the tiny task model: loss, learning, determinism, early stop."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.data import char_vocab
from pipo_jax.models import qwen3
from pipo_jax.run import teacher_forcing, warmup
from pipo_jax.tasks import arithmetic as ar

TASK = ar.ArithmeticTask(max_digits=1, heldout_fraction=0.3)  # 1-digit '+'/'-', reversed answers
MODEL = warmup.task_model_config(hidden_size=64, head_dim=16, intermediate_size=128)
RUN = dict(batch=32, lr=1e-2, eval_every=20, eval_n=64)
# Jitted helpers: eager dispatch of the model's many small ops is slow on CPU.
answer_loss = jax.jit(warmup.answer_loss, static_argnums=0)
full_logits = jax.jit(qwen3.logits, static_argnums=0)


def tree_equal(a, b) -> bool:
    return all(jax.tree.leaves(jax.tree.map(lambda x, y: bool(np.array_equal(x, y)), a, b)))


def test_task_model_config():
    c = warmup.task_model_config()
    assert c.vocab_size == 32 >= char_vocab.VOCAB_SIZE
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (128, 2, 4, 2)
    assert warmup.task_model_config(num_hidden_layers=3).num_hidden_layers == 3


def test_answer_loss_matches_reference():
    params = qwen3.init_params(MODEL, jax.random.PRNGKey(1), std=0.3)  # far from uniform
    p = ar.make_problems(TASK, np.array([7, 9, 3]), np.array([0, 1, 0]), np.array([5, 2, 0]))  # 21<eos>, 7<eos>, 3<eos>
    tokens = jnp.concatenate([p.prompt_tokens_bp, p.target_tokens_ba], axis=1)
    mask = jnp.concatenate([p.prompt_mask_bp, p.target_mask_ba], axis=1)
    logits = np.asarray(full_logits(MODEL, params, tokens, mask), np.float64)
    nll = []
    for b in range(3):
        for i in range(int(p.target_len_b[b])):
            z = logits[b, TASK.prompt_len - 1 + i]
            logz = np.log(np.sum(np.exp(z - z.max()))) + z.max()
            nll.append(logz - z[int(p.target_tokens_ba[b, i])])
    assert len(nll) == 3 + 2 + 2
    got = float(answer_loss(MODEL, params, p))
    assert got == pytest.approx(np.mean(nll), rel=1e-5)


@pytest.fixture(scope="module")
def short_run():
    return warmup.warmup(MODEL, TASK, steps=40, seed=0, **RUN)


def test_short_warmup_reduces_the_loss(short_run):
    params, m = short_run
    batch = jax.jit(ar.sample_problems, static_argnums=(0, 2, 3))(TASK, jax.random.PRNGKey(123), 256, "train")
    initial = float(answer_loss(MODEL, warmup.initial_params(MODEL, 0), batch))
    assert initial == pytest.approx(math.log(MODEL.vocab_size), abs=0.05)  # N(0, 0.02) init: near-uniform
    final = float(answer_loss(MODEL, params, batch))
    print(f"fixed-batch loss {initial:.3f} -> {final:.3f}; accuracy curve {m['heldout_accuracy']}")
    assert final < initial - 2.0, (initial, final)
    assert m["loss"].shape == (40,) and m["loss"][0] == pytest.approx(initial, abs=0.05)
    assert m["loss"][-5:].mean() < m["loss"][:5].mean() - 2.0
    assert m["eval_steps"] == [0, 20, 40] and len(m["heldout_accuracy"]) == 3
    assert m["initial_accuracy"] == 0.0 and m["steps_run"] == 40 and not m["stopped_early"]
    assert m["final_accuracy"] == m["heldout_accuracy"][-1]
    assert m["final_accuracy"] == pytest.approx(float(teacher_forcing.heldout_accuracy(MODEL, params, TASK, None, 64, jax.random.split(
        jax.random.PRNGKey(0), 3)[2])))


def test_warmup_is_deterministic(short_run):
    params, m = short_run
    again, m2 = warmup.warmup(MODEL, TASK, steps=40, seed=0, **RUN)
    assert tree_equal(params, again)
    np.testing.assert_array_equal(m["loss"], m2["loss"])
    assert m["heldout_accuracy"] == m2["heldout_accuracy"]
    other, _ = warmup.warmup(MODEL, TASK, steps=40, seed=1, **RUN)
    assert not tree_equal(params, other)


def test_stops_at_the_first_evaluation_reaching_the_target():
    target = 0.1
    params, m = warmup.warmup(MODEL, TASK, steps=400, seed=0, target_accuracy=target, **RUN)
    acc = m["heldout_accuracy"]
    print(f"accuracy curve {acc} at steps {m['eval_steps']}")
    assert acc[-1] >= target and all(a < target for a in acc[:-1])
    assert m["stopped_early"] and m["steps_run"] < 400 and m["steps_run"] == m["eval_steps"][-1]
    assert m["steps_run"] % RUN["eval_every"] == 0 and m["loss"].shape == (m["steps_run"],)
    # stopping early is the same run cut short
    plain, _ = warmup.warmup(MODEL, TASK, steps=m["steps_run"], seed=0, **RUN)
    assert tree_equal(params, plain)


def test_target_met_at_start_and_given_params():
    start = qwen3.init_params(MODEL, jax.random.PRNGKey(7))
    params, m = warmup.warmup(MODEL, TASK, steps=40, seed=0, target_accuracy=0.0, params=start, **RUN)
    assert m["steps_run"] == 0 and m["stopped_early"] and m["loss"].shape == (0,) and m["eval_steps"] == [0]
    assert tree_equal(params, start)
    trained, _ = warmup.warmup(MODEL, TASK, steps=20, seed=0, params=start, **RUN)
    assert not tree_equal(trained, start)
    assert tree_equal(start, qwen3.init_params(MODEL, jax.random.PRNGKey(7)))  # the caller's params are not donated


@pytest.mark.parametrize("kwargs, match", [
    (dict(steps=0), "steps=0"),
    (dict(batch=0), "batch=0"),
    (dict(eval_every=0), "eval_every=0"),
    (dict(target_accuracy=1.5), "target_accuracy=1.5"),
    (dict(model_config=MODEL.replace(vocab_size=16)), "vocab_size=16"),
    (dict(model_config=MODEL.replace(max_position_embeddings=4)), "max_position_embeddings=4"),
])
def test_bad_arguments_name_the_field(kwargs, match):
    args = dict(model_config=MODEL, task=TASK, steps=10, batch=8, lr=1e-3, seed=0) | kwargs
    with pytest.raises(ValueError, match=match):
        warmup.warmup(args.pop("model_config"), args.pop("task"), **args)
