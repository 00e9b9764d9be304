"""One-jit `sampler.generate`: HF greedy parity, exact log-probs, stops, budgets, keys."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.models import hf, qwen3
from pipo_jax.sampling import sampler
from pipo_jax.sampling.sampling_params import SamplingParams
from pipo_jax.sampling.token_sampling import reference_truncation_mask
from tests.conftest import make_hf_qwen3

LENGTHS = (3, 7, 5, 1)


def left_padded(prompts, width=None):
    width = width or max(len(p) for p in prompts)
    tokens = np.zeros((len(prompts), width), np.int32)
    mask = np.zeros((len(prompts), width), np.int32)
    for i, p in enumerate(prompts):
        tokens[i, width - len(p) :] = p
        mask[i, width - len(p) :] = 1
    return tokens, mask


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf_sampler")
    model = make_hf_qwen3(path, tied=False)
    config, params = hf.load(str(path))
    return model, config, params


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.RandomState(0)
    return [list(rng.randint(1, 128, n)) for n in LENGTHS]


def _hf_greedy(model, tokens, mask, new, eos=None):
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor(tokens, dtype=torch.long), attention_mask=torch.tensor(mask, dtype=torch.long),
                             max_new_tokens=new, do_sample=False, eos_token_id=eos, pad_token_id=0)
    return out[:, tokens.shape[1] :].numpy()


def test_greedy_equals_transformers_generate(hf_model, prompts):
    model, config, params = hf_model
    tokens, mask = left_padded(prompts)
    out = sampler.generate(config, params, tokens, mask, jax.random.key(0),
                           SamplingParams(max_new_tokens=12, temperature=0.0))
    np.testing.assert_array_equal(np.asarray(out.tokens_br), _hf_greedy(model, tokens, mask, 12))
    np.testing.assert_array_equal(np.asarray(out.mask_br), 1)
    np.testing.assert_array_equal(np.asarray(out.lengths_b), 12)
    assert not np.asarray(out.stopped_b).any()
    assert int(out.num_steps) == 11


def test_greedy_with_stop_tokens_equals_transformers_eos(hf_model, prompts):
    model, config, params = hf_model
    tokens, mask = left_padded(prompts)
    free = _hf_greedy(model, tokens, mask, 12)
    stops = (int(free[0, 4]), int(free[2, 2]))  # make rows 0 and 2 end early
    out = sampler.generate(config, params, tokens, mask, jax.random.key(0),
                           SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=stops, pad_id=0))
    ref = _hf_greedy(model, tokens, mask, 12, eos=list(stops))  # HF pads finished rows with 0
    ours = np.asarray(out.tokens_br)
    np.testing.assert_array_equal(ours[:, : ref.shape[1]], ref)
    for b in range(4):
        hits = [i for i in range(12) if free[b, i] in stops]
        n = hits[0] + 1 if hits else 12
        assert int(out.lengths_b[b]) == n
        assert bool(out.stopped_b[b]) == bool(hits)
        np.testing.assert_array_equal(ours[b, :n], free[b, :n])  # stop token included
        np.testing.assert_array_equal(ours[b, n:], 0)
        np.testing.assert_array_equal(np.asarray(out.mask_br[b]), np.arange(12) < n)
        np.testing.assert_array_equal(np.asarray(out.logprobs_br[b, n:]), 0.0)


def _teacher_forced_logits(config, params, out):
    """Logits `[B, R, V]` that predict each response token, from one uncached forward."""
    p = out.prompt_tokens_bp.shape[1]
    logits = jax.jit(qwen3.logits, static_argnums=0)(config, params, out.sequence_bl, out.sequence_mask_bl)
    return np.asarray(logits[:, p - 1 : -1], np.float64)


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_logprobs_equal_teacher_forced_recompute(hf_model, prompts):
    _, config, params = hf_model
    tokens, mask = left_padded(prompts)
    out = sampler.generate(config, params, tokens, mask, jax.random.key(7),
                           SamplingParams(max_new_tokens=10, temperature=1.0, stop_token_ids=(5, 6, 7, 8)))
    logits = _teacher_forced_logits(config, params, out)
    m = np.asarray(out.mask_br)
    got = np.take_along_axis(_log_softmax(logits), np.asarray(out.tokens_br)[..., None], -1)[..., 0]
    assert np.abs((got - np.asarray(out.logprobs_br)) * m).max() <= 1e-4
    assert m.sum() > 20  # enough sampled tokens to mean something


@pytest.mark.parametrize("mode", ["sampled", "tempered", "raw"])
def test_truncated_logprob_modes_equal_teacher_forced(hf_model, prompts, mode):
    _, config, params = hf_model
    tokens, mask = left_padded(prompts)
    temp, top_k, top_p = 0.7, 20, 0.9
    out = sampler.generate(config, params, tokens, mask, jax.random.key(3),
                           SamplingParams(max_new_tokens=8, temperature=temp, top_k=top_k, top_p=top_p, logprobs=mode))
    logits = _teacher_forced_logits(config, params, out)
    toks = np.asarray(out.tokens_br)
    for b in range(4):
        for i in range(8):
            z = logits[b, i] / temp
            kept = reference_truncation_mask(z, top_k, top_p)
            assert kept[toks[b, i]], (b, i)  # every sampled token lies in the truncated set
            if mode == "sampled":
                want = _log_softmax(np.where(kept, z, -np.inf))[toks[b, i]]
            elif mode == "tempered":
                want = _log_softmax(z)[toks[b, i]]
            else:
                want = _log_softmax(logits[b, i])[toks[b, i]]
            assert abs(float(out.logprobs_br[b, i]) - want) <= 1e-4, (b, i, mode)


def test_rows_depend_only_on_their_key(hf_model, prompts):
    """Row b of a batch == the same prompt alone with key fold_in(rng, b): no cross-row effects."""
    _, config, params = hf_model
    tokens, mask = left_padded(prompts)
    rng = jax.random.key(11)
    sp = SamplingParams(temperature=1.0, top_k=50, max_new_tokens=9)
    out = sampler.generate(config, params, tokens, mask, rng, sp)
    for b in (1, 3):
        one_t, one_m = left_padded([prompts[b]])
        alone = sampler.generate(config, params, one_t, one_m, jax.random.fold_in(rng, b)[None], sp)
        np.testing.assert_array_equal(np.asarray(alone.tokens_br[0]), np.asarray(out.tokens_br[b]))
        np.testing.assert_allclose(np.asarray(alone.logprobs_br[0]), np.asarray(out.logprobs_br[b]), atol=1e-5)
    # Raw uint32 keys work too and give the same draws as the typed key they wrap.
    raw = sampler.generate(config, params, tokens, mask, jax.random.key_data(rng), sp)
    np.testing.assert_array_equal(np.asarray(raw.tokens_br), np.asarray(out.tokens_br))


def test_budgets_max_length_and_early_exit(hf_model, prompts):
    _, config, params = hf_model
    tokens, mask = left_padded(prompts)
    sp = SamplingParams(temperature=1.0, max_new_tokens=10)
    budgets = jnp.array([1, 4, 10, 3])
    out = sampler.generate(config, params, tokens, mask, jax.random.key(5), sp, max_new_b=budgets)
    full = sampler.generate(config, params, tokens, mask, jax.random.key(5), sp)
    np.testing.assert_array_equal(np.asarray(out.lengths_b), [1, 4, 10, 3])
    for b, n in enumerate([1, 4, 10, 3]):
        np.testing.assert_array_equal(np.asarray(out.tokens_br[b, :n]), np.asarray(full.tokens_br[b, :n]))
        np.testing.assert_array_equal(np.asarray(out.tokens_br[b, n:]), 0)
    assert not np.asarray(out.stopped_b).any()
    # Only rows with budget <= 4 left: the loop exits after 3 decode steps.
    short = sampler.generate(config, params, tokens, mask, jax.random.key(5), sp, max_new_b=jnp.array([1, 4, 2, 3]))
    assert int(short.num_steps) == 3
    one = sampler.generate(config, params, tokens, mask, jax.random.key(5), sp.replace(max_new_tokens=1))
    assert one.tokens_br.shape == (4, 1) and int(one.num_steps) == 0
    np.testing.assert_array_equal(np.asarray(one.tokens_br[:, 0]), np.asarray(full.tokens_br[:, 0]))


def test_attention_ladder_phases_do_not_change_results(hf_model, prompts):
    _, config, params = hf_model
    tokens, mask = left_padded(prompts)
    sp = SamplingParams(temperature=1.0, max_new_tokens=30)
    a = sampler.generate(config, params, tokens, mask, jax.random.key(2), sp, attn_block=8)  # 4 phases
    b = sampler.generate(config, params, tokens, mask, jax.random.key(2), sp, attn_block=4096)  # 1 phase
    np.testing.assert_array_equal(np.asarray(a.tokens_br), np.asarray(b.tokens_br))
    np.testing.assert_allclose(np.asarray(a.logprobs_br), np.asarray(b.logprobs_br), atol=1e-5)


def test_generate_inside_jit_and_scan(hf_model, prompts):
    _, config, params = hf_model
    tokens, mask = left_padded(prompts)
    sp = SamplingParams(temperature=1.0, max_new_tokens=5)

    @jax.jit
    def two_rounds(params, rng):
        def body(carry, key):
            out = sampler.generate(config, params, tokens, mask, key, sp)
            return carry + jnp.sum(out.lengths_b), out.tokens_br
        return jax.lax.scan(body, 0, jax.random.split(rng, 2))

    total, toks = two_rounds(params, jax.random.key(9))
    assert int(total) == 2 * 4 * 5
    direct = sampler.generate(config, params, tokens, mask, jax.random.split(jax.random.key(9), 2)[1], sp)
    np.testing.assert_array_equal(np.asarray(toks[1]), np.asarray(direct.tokens_br))


def test_bad_inputs_raise_clear_errors(hf_model, prompts):
    _, config, params = hf_model
    tokens, mask = left_padded(prompts)
    with pytest.raises(ValueError, match="prompt_mask_bp"):
        sampler.generate(config, params, tokens, mask[:, 1:], jax.random.key(0))
    with pytest.raises(ValueError, match="stop_token_ids"):
        sampler.generate(config, params, tokens, mask, jax.random.key(0), SamplingParams(stop_token_ids=(10_000,)))
    with pytest.raises(ValueError, match="key shape"):
        sampler.generate(config, params, tokens, mask, jax.random.split(jax.random.key(0), 3))
