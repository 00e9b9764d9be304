"""The built-in task's character vocabulary as a Hugging Face tokenizer: the project's ids, the
project's strings, saved and read back by `AutoTokenizer`."""

import jax
import numpy as np
import pytest

from pipo_jax.data import char_tokenizer
from pipo_jax.data import char_vocab as cv
from pipo_jax.data import text_vocab
from pipo_jax.tasks import arithmetic


def test_every_token_and_task_prompts_round_trip_like_char_vocab(tmp_path):
    from transformers import AutoTokenizer

    char_tokenizer.hf_tokenizer().save_pretrained(str(tmp_path))
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    assert tok.get_vocab() == cv.TOKEN_TO_ID
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (cv.PAD_ID, cv.BOS_ID, cv.EOS_ID)
    everything = "".join(cv.TOKENS)
    assert tok.encode(everything) == cv.encode(everything) == list(range(cv.VOCAB_SIZE))
    assert tok.decode(list(range(cv.VOCAB_SIZE))) == everything
    task = arithmetic.ArithmeticTask(min_digits=1, max_digits=3, ops="+-*", answer_format="worked")
    problems = arithmetic.sample_problems(task, jax.random.PRNGKey(0), 32)
    texts = [cv.decode(t, skip_pad=True) for t in np.asarray(problems.prompt_tokens_bp)]
    texts += [cv.decode(t, skip_pad=True) for t in np.asarray(problems.target_tokens_ba)]
    for text in texts + ["<bos>12+34=<wrong><at>3;46<eos>", "<solve><solution>7<feedback><correct><answer>-3"]:
        assert tok.encode(text) == cv.encode(text)
        assert tok.decode(cv.encode(text)) == text
    assert tok.decode(cv.encode("<bos>12=<eos><pad>"), skip_special_tokens=True) == "12="


def test_a_character_outside_the_vocabulary_is_an_error():
    tok = char_tokenizer.hf_tokenizer()
    with pytest.raises(Exception, match="UNK|unk"):
        tok.encode("1 + 2")


def test_the_text_vocabulary_tokenizer_matches_text_vocab(tmp_path):
    """reasoning-gym's character form exports `text_vocab`: same ids, every other character one token."""
    from transformers import AutoTokenizer

    char_tokenizer.hf_tokenizer(text_vocab.TOKENS).save_pretrained(str(tmp_path))
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    assert tok.get_vocab() == {t: i for i, t in enumerate(text_vocab.TOKENS)}
    for text in ("Hello, World! 12/34 = 0.5?", "spell 'abc' backward: cba", "x_1 (y) [z] {w} ~`|\\\"#$%&^@\n"):
        assert tok.encode(text) == text_vocab.encode(text)
        assert tok.decode(text_vocab.encode(text)) == text
    prompt = [text_vocab.BOS_ID] + text_vocab.encode("49, 29") + [text_vocab.ANSWER_ID]
    assert tok.decode(prompt) == "<bos>49, 29<answer>"
    with pytest.raises(ValueError, match="starts with char_vocab.TOKENS"):
        char_tokenizer.backend_tokenizer(("a", "b"))
