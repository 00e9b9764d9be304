"""A tiny byte-level BPE tokenizer with a Qwen3-style chat template, saved to a dir."""
import json
import os

QWEN3_STYLE_TEMPLATE = (
    "{%- if messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}"
    "{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def save_tiny_tokenizer(path, chat_template=QWEN3_STYLE_TEMPLATE, generation_eos=None):
    """Train a 300-token byte-level BPE on a few sentences and save it as an HF dir."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = ["What is 1 + 2? Please reason step by step, and put your final answer within \\boxed{}.",
              "Find the sum of all x such that x^2 = 4. The answer is 0."] * 20
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    if chat_template is not None:
        fast.chat_template = chat_template
    fast.save_pretrained(str(path))
    if generation_eos is not None:
        with open(os.path.join(str(path), "generation_config.json"), "w") as f:
            json.dump({"eos_token_id": generation_eos}, f)
    return str(path)


def save_tiny_model_dir(path) -> str:
    """A random tiny Qwen3 (vocab 320, 2 layers) with this tokenizer and its chat template in one
    HF directory (offline); returns the path."""
    import jax

    from pipo_jax.models import hf, qwen3

    save_tiny_tokenizer(path)
    config = qwen3.Qwen3Config(vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                               max_position_embeddings=512, tie_word_embeddings=True)
    hf.save(str(path), config, qwen3.init_params(config, jax.random.PRNGKey(0)))
    return str(path)
