"""Evaluation pipeline: policy loading, sampling n per problem, verification, pass@k."""

import json

import jax
import numpy as np
import pytest

from pipo_jax.data.prompts import PromptConfig
from pipo_jax.data.sources import SourceConfig, load_examples
from pipo_jax.data.tokenizer import load_tokenizer
from pipo_jax.models import hf
from pipo_jax.run import evaluate
from pipo_jax.sampling.sampling_params import SamplingParams
from pipo_jax.tasks import passk
from pipo_jax.tasks.math import MathVerifier, MathVerifyConfig
from tests.conftest import make_hf_qwen3
from tests.data.tiny_tokenizer import save_tiny_tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("policy")
    save_tiny_tokenizer(str(path))
    make_hf_qwen3(path, tied=True, vocab_size=320)
    return path


def test_load_policy_from_hf_dir_and_errors(model_dir, tmp_path):
    config, params, spec = evaluate.load_policy(str(model_dir))
    assert spec is None and config.vocab_size == 320
    ref_config, ref_params = hf.load(str(model_dir))
    jax.tree.map(np.testing.assert_array_equal, params, ref_params)
    with pytest.raises(FileNotFoundError, match="neither a Hugging Face directory"):
        evaluate.load_policy(str(tmp_path))


def test_sample_n_shapes_and_reproducibility(model_dir):
    config, params, _ = evaluate.load_policy(str(model_dir))
    prompts = np.array([[0, 5, 6], [7, 8, 9]], np.int32)
    mask = np.array([[0, 1, 1], [1, 1, 1]], np.int32)
    sampling = SamplingParams(max_new_tokens=4, temperature=1.0, stop_token_ids=(2,), pad_id=0)
    t1, m1 = evaluate.sample_n(config, params, prompts, mask, 3, jax.random.PRNGKey(0), sampling, batch_size=4)
    t2, _ = evaluate.sample_n(config, params, prompts, mask, 3, jax.random.PRNGKey(0), sampling, batch_size=4)
    assert t1.shape == m1.shape == (2, 3, 4)
    np.testing.assert_array_equal(t1, t2)
    assert m1[:, :, 0].all()  # every sample has at least its first token


def test_math_rewards_verify_decoded_samples(model_dir, tmp_path, monkeypatch):
    data = tmp_path / "bench.jsonl"
    data.write_text("\n".join(json.dumps({"problem": f"What is {a} + {b}?", "answer": str(a + b)})
                              for a, b in [(1, 2), (3, 4)]) + "\n")
    examples = load_examples(SourceConfig(str(data)))
    tokenizer = load_tokenizer(str(model_dir))
    config, params, _ = evaluate.load_policy(str(model_dir))

    def scripted(model, params, tokens, mask, n, rng, sampling, batch_size):
        # Sample j of problem p answers correctly iff j is even; one is right but unboxed.
        answers = [[f"so \\boxed{{{g + (j % 2)}}}" for j in range(n)] for g in (3, 7)]
        answers[1][2] = "the answer is 7"
        ids = [[tokenizer(a)["input_ids"] for a in row] for row in answers]
        width = max(len(x) for row in ids for x in row)
        out = np.zeros((2, n, width), np.int32)
        out_mask = np.zeros_like(out)
        for p, row in enumerate(ids):
            for j, x in enumerate(row):
                out[p, j, :len(x)], out_mask[p, j, :len(x)] = x, 1
        return out, out_mask

    monkeypatch.setattr(evaluate, "sample_n", scripted)
    with MathVerifier(MathVerifyConfig(isolation="inline")) as verifier:
        rewards, info = evaluate.math_rewards(config, params, tokenizer, examples, PromptConfig(max_prompt_tokens=256),
                                              verifier, 4, jax.random.PRNGKey(0),
                                              SamplingParams(max_new_tokens=8, stop_token_ids=(2,), pad_id=0))
    np.testing.assert_array_equal(rewards, [[1, 0, 1, 0], [1, 0, 0, 0]])
    assert info == {"dropped": 0, "truncated": 0, "problems": 2, "unscored": 0}
    rows = passk.summarize({"bench": rewards}, ks=(1, 2))
    # pass@1 = mean reward = 3/8; pass@2 = mean over problems of 1 - C(n-c,2)/C(4,2): (1 - 1/6 + 1 - 3/6) / 2
    assert rows[0].pass_at[1] == pytest.approx(3 / 8)
    assert rows[0].pass_at[2] == pytest.approx((5 / 6 + 1 / 2) / 2)
