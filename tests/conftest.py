"""Shared fixtures: tiny random Hugging Face Qwen3 checkpoints written to temp dirs."""

import numpy as np
import pytest


def make_hf_qwen3(path, *, tied: bool, seed: int = 0, vocab_size: int = 128, num_hidden_layers: int = 2):
    """Saves a random fp32 `transformers.Qwen3ForCausalLM` (GQA: 2 query heads per kv head).

    Norm weights are randomised too, so a loader that skips them cannot pass.
    Returns the torch model (eval mode).
    """
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Qwen3Config(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=num_hidden_layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=tied,
        rope_theta=10_000.0, max_position_embeddings=256,
    )
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    model.save_pretrained(str(path))
    return model


def hf_logits(model, tokens_bt: np.ndarray, mask_bt: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = model(torch.tensor(tokens_bt, dtype=torch.long), attention_mask=torch.tensor(mask_bt, dtype=torch.long))
    return out.logits.float().numpy()


@pytest.fixture(scope="session", params=[False, True], ids=["untied", "tied"])
def hf_checkpoint(request, tmp_path_factory):
    """(path, torch model, tied) for untied and tied tiny Qwen3 checkpoints."""
    path = tmp_path_factory.mktemp("hf_tied" if request.param else "hf_untied")
    model = make_hf_qwen3(path, tied=request.param)
    return path, model, request.param


@pytest.fixture
def right_padded_batch():
    """tokens [3, 9] and a right-padded mask with rows of length 9, 6 and 3."""
    rng = np.random.RandomState(0)
    tokens = rng.randint(0, 128, (3, 9))
    mask = np.ones((3, 9), np.int64)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    return tokens, mask
