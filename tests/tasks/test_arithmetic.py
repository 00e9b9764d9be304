"""The built-in arithmetic task: vocabulary, tokens, split, reward, feedback, greedy accuracy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.data import char_vocab as cv
from pipo_jax.tasks import arithmetic as ar

# ----------------------------------------------------------------------------- helpers


def ids(text: str) -> list[int]:
    return cv.encode(text)


def row_text(tokens, mask=None) -> str:
    tokens = np.asarray(tokens)
    if mask is not None:
        tokens = tokens[np.asarray(mask) == 1]
    return cv.decode(tokens)


def responses(task, texts):
    """Right-padded response tokens/masks `[b, max(answer_len, longest text)]` from strings."""
    b, a = len(texts), max([task.answer_len] + [len(ids(t)) for t in texts])
    tokens = np.full((b, a), cv.PAD_ID, np.int32)
    mask = np.zeros((b, a), np.int32)
    for i, t in enumerate(texts):
        row = ids(t)
        tokens[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return jnp.asarray(tokens), jnp.asarray(mask)


# Jitted once per (task, batch, split): eager dispatch of the many small ops is slow.
sample = jax.jit(ar.sample_problems, static_argnums=(0, 2, 3))
make = jax.jit(ar.make_problems, static_argnums=0)

M32 = 0xFFFFFFFF


def ref_fmix(h):
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)


def ref_hash(lhs, op, rhs, seed):
    """Pure-Python MurmurHash3-finaliser chain (the documented split hash)."""
    h = ref_fmix((op + seed * 0x9E3779B9) & M32)
    h = ref_fmix(h ^ lhs)
    return ref_fmix(((h + 0x9E3779B9) & M32) ^ rhs)


def ref_is_heldout(task, lhs, op, rhs):
    return ref_hash(lhs, op, rhs, task.split_seed) < int(task.heldout_fraction * 2**32)


# ----------------------------------------------------------------------------- vocabulary


def test_vocab_ids_and_round_trip():
    assert (cv.PAD_ID, cv.BOS_ID, cv.EOS_ID) == (0, 1, 2)
    assert [cv.token_id(str(d)) for d in range(10)] == list(range(3, 13))
    assert [cv.token_id(op) for op in cv.OPERATORS] == [cv.PLUS_ID, cv.PLUS_ID + 1, cv.PLUS_ID + 2]
    assert cv.VOCAB_SIZE == len(cv.TOKENS) == 25
    for text in ["<bos>47+85=", "231<eos>", "<wrong><at>2", "12-345=-333;0*7", "<solution>9<feedback><solve>", ""]:
        assert cv.decode(cv.encode(text)) == text
    assert cv.encode("<bos>4+5=") == [1, 7, 13, 8, 16]
    assert cv.encode("<correct><answer>") == [18, 21]
    assert cv.decode([0, 0, 1, 7, 2, 0], skip_pad=True) == "<bos>4<eos>"
    assert cv.decode(np.array([1, 7])) == "<bos>4"


def test_vocab_errors_name_the_position():
    with pytest.raises(ValueError, match=r"'x' at position 2"):
        cv.encode("12x")
    with pytest.raises(ValueError, match=r"'<nope>' at position 1"):
        cv.encode("1<nope>")
    with pytest.raises(ValueError, match="id 99 at position 1"):
        cv.decode([1, 99])
    with pytest.raises(ValueError, match="unknown token"):
        cv.token_id("a")


# ----------------------------------------------------------------------------- config


def test_task_lengths_are_derived_from_the_longest_problem():
    t = ar.ArithmeticTask()
    assert (t.min_digits, t.max_digits, t.ops, t.answer_format) == (1, 2, ("+", "-"), "reversed")
    assert (t.prompt_len, t.answer_len) == (7, 4)  # <bos>99+99=, 198<eos>
    t = ar.ArithmeticTask(max_digits=3, ops="+-*", allow_negative=True, answer_format="plain")
    assert t.ops == ("+", "-", "*")
    assert (t.prompt_len, t.answer_len) == (9, 8)  # '-' sign + 6 digits of 999*999 + <eos>
    assert ar.ArithmeticTask(max_digits=3, ops="+-*", allow_negative=True, answer_format="worked").answer_len == 15
    assert ar.ArithmeticTask(prompt_len=12, answer_len=6).sequence_len == 18
    assert ar.ArithmeticTask(feedback_style="position").feedback_len == 3  # <wrong><at>k
    assert ar.ArithmeticTask(feedback_style="reveal").feedback_len == 5  # <wrong><answer>198


@pytest.mark.parametrize("kwargs, match", [
    (dict(ops=("+", "/")), "ArithmeticTask.ops"),
    (dict(ops=("+", "+")), "ArithmeticTask.ops"),
    (dict(ops=()), "ArithmeticTask.ops"),
    (dict(min_digits=3, max_digits=2), "min_digits=3"),
    (dict(max_digits=5, ops="*"), "max_digits=5"),
    (dict(max_digits=9), "max_digits=9"),
    (dict(answer_format="long"), "answer_format='long'"),
    (dict(reward_mode="soft"), "reward_mode='soft'"),
    (dict(feedback_style="loud"), "feedback_style='loud'"),
    (dict(heldout_fraction=0.0), "heldout_fraction=0.0"),
    (dict(heldout_fraction=1.0), "heldout_fraction=1.0"),
    (dict(prompt_len=6), "prompt_len=6 < 7"),
    (dict(answer_len=3), "answer_len=3 < 4"),
    (dict(max_digits=1, ops="+", heldout_fraction=1e-4), "both splits must be non-empty"),
])
def test_task_validation_names_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ar.ArithmeticTask(**kwargs)


# ----------------------------------------------------------------------------- tokens


FMT_CASES = {  # 47+85, 5-9, 0*7, 12-345, 999*999
    "plain": ["132", "-4", "0", "-333", "998001"],
    "reversed": ["231", "-4", "0", "-333", "100899"],
    "worked": ["231;132", "4;-4", "0;0", "333;-333", "100899;998001"],
}


@pytest.mark.parametrize("fmt", ar.ANSWER_FORMATS)
def test_make_problems_exact_tokens(fmt):
    task = ar.ArithmeticTask(max_digits=3, ops="+-*", allow_negative=True, answer_format=fmt)
    p = make(task, np.array([47, 5, 0, 12, 999]), np.array([0, 1, 2, 1, 2]), np.array([85, 9, 7, 345, 999]))
    prompts = ["<pad><pad><bos>47+85=", "<pad><pad><pad><pad><bos>5-9=", "<pad><pad><pad><pad><bos>0*7=",
               "<pad><bos>12-345=", "<bos>999*999="]
    for i, (prompt, answer) in enumerate(zip(prompts, FMT_CASES[fmt])):
        assert row_text(p.prompt_tokens_bp[i]) == prompt
        np.testing.assert_array_equal(p.prompt_mask_bp[i], [0 if t == "<pad>" else 1 for t in _split(prompt)])
        target = answer + "<eos>"
        want = ids(target) + [cv.PAD_ID] * (task.answer_len - len(ids(target)))
        np.testing.assert_array_equal(p.target_tokens_ba[i], want)
        np.testing.assert_array_equal(p.target_mask_ba[i], [1] * len(ids(target)) + [0] * (len(want) - len(ids(target))))
        assert int(p.target_len_b[i]) == len(ids(target))
    np.testing.assert_array_equal(p.answer_b, [132, -4, 0, -333, 998001])
    assert p.prompt_tokens_bp.dtype == jnp.int32 and p.target_tokens_ba.shape == (5, task.answer_len)


def _split(prompt: str) -> list[str]:
    return [cv.TOKENS[i] for i in cv.encode(prompt)]


def test_pad_operands_and_longer_prompt_len():
    task = ar.ArithmeticTask(max_digits=3, pad_operands=True, prompt_len=11)
    p = make(task, np.array([47, 0]), np.array([0, 1]), np.array([5, 0]))
    assert row_text(p.prompt_tokens_bp[0]) == "<pad><pad><bos>047+005="
    assert row_text(p.prompt_tokens_bp[1]) == "<pad><pad><bos>000-000="
    assert row_text(p.target_tokens_ba[0], p.target_mask_ba[0]) == "25<eos>"
    assert row_text(p.target_tokens_ba[1], p.target_mask_ba[1]) == "0<eos>"


def test_make_problems_rejects_problems_outside_the_task():
    task = ar.ArithmeticTask()  # 1-2 digits, '+' and '-', no negative answers
    with pytest.raises(ValueError, match=r"lhs_b\[1\]=100"):
        ar.make_problems(task, np.array([5, 100]), np.array([0, 0]), np.array([1, 1]))
    with pytest.raises(ValueError, match=r"rhs_b\[0\]=-1"):
        ar.make_problems(task, np.array([5]), np.array([0]), np.array([-1]))
    with pytest.raises(ValueError, match=r"op_b\[0\]=2"):
        ar.make_problems(task, np.array([5]), np.array([2]), np.array([1]))
    with pytest.raises(ValueError, match=r"\(3-4\) is negative"):
        ar.make_problems(task, np.array([3]), np.array([1]), np.array([4]))


def test_pack_left_and_right():
    toks = jnp.array([[5, 6, 7], [8, 9, 10]])
    valid = jnp.array([[True, False, True], [False, False, True]])
    t, m = ar.pack([(toks, valid)], 4, left_pad=True)
    np.testing.assert_array_equal(t, [[0, 0, 5, 7], [0, 0, 0, 10]])
    np.testing.assert_array_equal(m, [[0, 0, 1, 1], [0, 0, 0, 1]])
    t, m = ar.pack([(toks, valid), (toks[:, :1], jnp.ones((2, 1), bool))], 4, left_pad=False)
    np.testing.assert_array_equal(t, [[5, 7, 5, 0], [10, 8, 0, 0]])
    np.testing.assert_array_equal(m, [[1, 1, 1, 0], [1, 1, 0, 0]])


# ----------------------------------------------------------------------------- sampling and split


def test_problem_hash_matches_python_reference():
    rng = np.random.RandomState(0)
    lhs, op, rhs = rng.randint(0, 10**8, 200), rng.randint(0, 3, 200), rng.randint(0, 10**8, 200)
    for seed in (0, 7):
        got = np.asarray(ar.problem_hash(lhs, op, rhs, seed))
        np.testing.assert_array_equal(got, [ref_hash(int(a), int(o), int(b), seed) for a, o, b in zip(lhs, op, rhs)])


def test_heldout_share_of_all_problems():
    task = ar.ArithmeticTask()  # 1-2 digits: 100*100 sums and 5050 ordered differences
    a, b = np.meshgrid(np.arange(100), np.arange(100), indexing="ij")
    held_add = np.asarray(ar.is_heldout(task, a, 0, b))
    keep = a >= b
    held_sub = np.asarray(ar.is_heldout(task, a[keep], 1, b[keep]))
    share = (held_add.sum() + held_sub.sum()) / (held_add.size + held_sub.size)
    assert abs(share - 0.1) < 0.01  # binomial std over 15050 problems is 0.0024


@pytest.mark.parametrize("kwargs", [dict(), dict(max_digits=3, ops="+-*", allow_negative=True, heldout_fraction=0.3)])
def test_train_and_heldout_never_overlap(kwargs):
    task = ar.ArithmeticTask(**kwargs)
    train = sample(task, jax.random.PRNGKey(0), 4096, "train")
    held = sample(task, jax.random.PRNGKey(0), 4096, "heldout")
    as_set = lambda p: set(zip(*(np.asarray(x).tolist() for x in (p.lhs_b, p.op_b, p.rhs_b))))
    train_set, held_set = as_set(train), as_set(held)
    assert not train_set & held_set
    assert len(held_set) > 400  # a real spread, not one repeated problem
    assert not any(ref_is_heldout(task, *p) for p in train_set)
    assert all(ref_is_heldout(task, *p) for p in held_set)
    other = ar.ArithmeticTask(**kwargs, split_seed=1)
    moved = sum(ref_is_heldout(other, *p) for p in held_set)
    assert moved < 0.5 * len(held_set)  # another split_seed gives another split


@pytest.mark.parametrize("kwargs", [dict(), dict(min_digits=2, max_digits=3, ops="+-*", allow_negative=True),
                                    dict(max_digits=3, ops="-", answer_format="worked")])
def test_sampled_problems_are_consistent(kwargs):
    task = ar.ArithmeticTask(**kwargs)
    p = jax.device_get(sample(task, jax.random.PRNGKey(3), 512, "train"))
    lengths = set()
    for i in range(512):
        prompt = row_text(p.prompt_tokens_bp[i], p.prompt_mask_bp[i])
        assert prompt.startswith("<bos>") and prompt.endswith("=")
        expr = prompt[len("<bos>"):-1]
        op = cv.OPERATORS[p.op_b[i]]
        lhs, rhs = expr.split(op) if op != "-" else expr.split("-", 1)
        assert (int(lhs), int(rhs)) == (p.lhs_b[i], p.rhs_b[i]) and op in task.ops
        lengths.update((len(lhs), len(rhs)))
        answer = eval(expr)  # digits and one operator, built by the test
        assert p.answer_b[i] == answer
        if not task.allow_negative:
            assert answer >= 0
        body = str(abs(answer))
        want = {"plain": ("-" if answer < 0 else "") + body,
                "reversed": ("-" if answer < 0 else "") + body[::-1],
                "worked": body[::-1] + ";" + ("-" if answer < 0 else "") + body}[task.answer_format]
        assert row_text(p.target_tokens_ba[i], p.target_mask_ba[i]) == want + "<eos>"
    assert lengths == set(range(task.min_digits, task.max_digits + 1))
    assert set(p.op_b.tolist()) == {cv.OPERATORS.index(o) for o in task.ops}


def test_sampling_under_jit_vmap_and_scan():
    task = ar.ArithmeticTask()
    key = jax.random.PRNGKey(11)
    keys = jax.random.split(key, 3)
    vmapped = jax.jit(jax.vmap(lambda k: ar.sample_problems(task, k, 8, split="heldout")))(keys)
    for i in range(3):
        one = sample(task, keys[i], 8, "heldout")
        jax.tree.map(lambda v, o, i=i: np.testing.assert_array_equal(v[i], o), vmapped, one)

    def iteration(carry, key):
        p = ar.sample_problems(task, key, 8)
        # a "policy" that gets every third row's first answer token wrong
        wrong = (jnp.arange(8) % 3 == 0)[:, None] & (jnp.arange(task.answer_len) == 0)[None, :]
        resp = jnp.where(wrong, cv.DIGIT0_ID + (p.target_tokens_ba - cv.DIGIT0_ID + 1) % 10, p.target_tokens_ba)
        r = ar.reward(task, p, resp, p.target_mask_ba)
        return carry + jnp.sum(r), p.lhs_b

    loop_keys = jax.random.split(key, 4)
    total, lhs = jax.jit(lambda ks: jax.lax.scan(iteration, 0.0, ks))(loop_keys)
    host_total = 0.0
    for i, k in enumerate(loop_keys):
        p = sample(task, k, 8, "train")
        np.testing.assert_array_equal(lhs[i], p.lhs_b)
        host_total += 8 - 3  # rows 0, 3, 6 are wrong
    assert float(total) == host_total


# ----------------------------------------------------------------------------- reward and feedback


def _hand_problems():
    task = ar.ArithmeticTask(max_digits=2, answer_format="plain")  # answer_len 4
    return task, make(task, np.array([47] * 8), np.array([0] * 8), np.array([85] * 8))  # target 132<eos>


def test_reward_hand_cases():
    task, p = _hand_problems()
    texts = ["132<eos>", "142<eos>", "132", "1320", "1322<eos>", "13<eos>", "<eos>", ""]
    tokens, mask = responses(task, texts)
    np.testing.assert_array_equal(ar.reward(task, p, tokens, mask), [1, 0, 0, 0, 0, 0, 0, 0])
    # an EOS present but masked out is missing
    np.testing.assert_array_equal(ar.reward(task, p, tokens, mask.at[0, 3].set(0)), [0, 0, 0, 0, 0, 0, 0, 0])
    # tokens after the first EOS are not read (generation has ended); wider responses are fine
    wide = jnp.concatenate([tokens, jnp.full((8, 3), cv.DIGIT0_ID + 5)], axis=1)
    np.testing.assert_array_equal(ar.reward(task, p, wide, jnp.ones_like(wide))[:2], [1, 0])
    # a response narrower than the target cannot hold the EOS
    np.testing.assert_array_equal(ar.reward(task, p, tokens[:, :3], mask[:, :3]), np.zeros(8))


def test_per_token_reward():
    task, p = _hand_problems()
    task = task.replace(reward_mode="per_token")
    tokens, mask = responses(task, ["132<eos>", "142<eos>", "132", "1322<eos>", "<eos>", "932<eos>"])
    first6 = jax.tree.map(lambda x: x[:6], p)
    np.testing.assert_allclose(ar.reward(task, first6, tokens, mask), [1.0, 0.75, 0.75, 0.75, 0.0, 0.75])


def test_reward_components_sum_to_the_reward():
    """`answer` and `stop` (weights 1, 1; GDPO's components), target 132<eos>. exact: the answer's three
    tokens right (1), and -1 when they are not followed by the <eos> ("132", "1320", "1322<eos>": the sum is
    the reward 0, as for a wrong answer, but the parts differ); per_token: the matching answer tokens / 4 and
    the <eos> in place / 4. On sampled problems and corrupted answers of every format the sum is the reward."""
    task, p = _hand_problems()
    assert task.capabilities.reward_components and [(c.name, c.weight) for c in task.reward_weights()] == [
        ("answer", 1.0), ("stop", 1.0)]
    texts = ["132<eos>", "142<eos>", "132", "1320", "1322<eos>", "13<eos>", "<eos>", ""]
    tokens, mask = responses(task, texts)
    np.testing.assert_array_equal(task.reward_components(p, tokens, mask),
                                  [[1, 0], [0, 0], [1, -1], [1, -1], [1, -1], [0, 0], [0, 0], [0, 0]])
    per_token = task.replace(reward_mode="per_token")
    np.testing.assert_allclose(per_token.reward_components(p, tokens, mask),
                               [[0.75, 0.25], [0.5, 0.25], [0.75, 0.0], [0.75, 0.0], [0.75, 0.0], [0.5, 0.0],
                                [0.0, 0.0], [0.0, 0.0]])
    for fmt in ("plain", "reversed", "worked"):
        for mode in ("exact", "per_token"):
            t = ar.ArithmeticTask(max_digits=3, ops="+-*", answer_format=fmt, reward_mode=mode)
            q = sample(t, jax.random.PRNGKey(0), 64, "train")
            flip = jax.random.bernoulli(jax.random.PRNGKey(1), 0.2, q.target_tokens_ba.shape)
            noise = jax.random.randint(jax.random.PRNGKey(2), q.target_tokens_ba.shape, 0, cv.VOCAB_SIZE)
            toks = jnp.where(flip, noise, q.target_tokens_ba)
            comps = jax.jit(t.reward_components)(q, toks, jnp.ones_like(toks))
            np.testing.assert_allclose(comps.sum(axis=1), ar.reward(t, q, toks, jnp.ones_like(toks)), atol=1e-6)
            assert len(np.unique(np.asarray(comps), axis=0)) > 2  # every part occurs


def test_feedback_position_style():
    task, p = _hand_problems()
    tokens, mask = responses(task, ["132<eos>", "142<eos>", "132", "932<eos>", "", "1322<eos>", "13<eos>", "132<eos>"])
    np.testing.assert_array_equal(ar.first_error_position(task, p, tokens, mask), [4, 1, 3, 0, 0, 3, 2, 4])
    fb, fm = ar.feedback_tokens(task, p, tokens, mask)
    assert fb.shape == (8, 3)
    got = [row_text(fb[i], fm[i]) for i in range(8)]
    assert got == ["<correct>", "<wrong><at>2", "<wrong><at>4", "<wrong><at>1", "<wrong><at>1", "<wrong><at>4",
                   "<wrong><at>3", "<correct>"]
    np.testing.assert_array_equal(fb[1], ids("<wrong><at>2"))
    np.testing.assert_array_equal(fm[0], [1, 0, 0])


def test_feedback_two_digit_position_and_reveal_style():
    task = ar.ArithmeticTask(max_digits=3, ops="+-*", allow_negative=True, answer_format="worked")
    assert task.answer_len == 15 and task.feedback_len == 4
    p = make(task, np.array([999, 12]), np.array([2, 1]), np.array([999, 345]))  # 100899;998001<eos> (14 tokens), 333;-333<eos>
    tokens, mask = responses(task, ["100899;998001", "333;-333<eos>"])
    fb, fm = ar.feedback_tokens(task, p, tokens, mask)
    assert [row_text(fb[i], fm[i]) for i in range(2)] == ["<wrong><at>14", "<correct>"]
    reveal = task.replace(feedback_style="reveal")
    fb, fm = ar.feedback_tokens(reveal, p, tokens, mask)
    assert fb.shape == (2, 16)
    assert [row_text(fb[i], fm[i]) for i in range(2)] == ["<wrong><answer>100899;998001", "<correct><answer>333;-333"]
    sol, sm = ar.solution_tokens(task, p)
    assert [row_text(sol[i], sm[i]) for i in range(2)] == ["100899;998001", "333;-333"]
    np.testing.assert_array_equal(sol[1], ids("333;-333") + [cv.PAD_ID] * 7)


def test_reward_and_feedback_jit():
    task, p = _hand_problems()
    tokens, mask = responses(task, ["132<eos>", "142<eos>"] * 4)
    f = jax.jit(lambda p, t, m: (ar.reward(task, p, t, m), ar.feedback_tokens(task, p, t, m)))
    r, (fb, _) = f(p, tokens, mask)
    np.testing.assert_array_equal(r, [1, 0] * 4)
    np.testing.assert_array_equal(fb[1], ids("<wrong><at>2"))
