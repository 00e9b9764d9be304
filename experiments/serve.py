"""Serve a policy through JetStream's gRPC server (the `[serve]` extra: `pip install -e ".[serve]"`),
with this project's slot engine behind a JetStream `Engine` adapter (`experiments/serving.py`).

    python -m experiments.serve --policy=runs/tiny --port=9000                 # a run's newest checkpoint
    python -m experiments.serve --policy=/models/Qwen3-0.6B --max_prefill_length=1024 --max_new_tokens=512

`--policy` is a training run's workdir (`--step=N`, default the newest checkpoint that reads) or a
Hugging Face directory; a text request is rendered as `experiments.chat` renders a line (the built-in
task: `47+85`; a text policy: its chat template, or the text as it is with `--prompt_style=raw`).
Decoding is greedy unless `--temperature` > 0. The server listens on `--host` (localhost unless told
otherwise) and runs until interrupted; docs/serving.md has a client. A prompt over the policy's max
prompt length (`--max_prefill_length`) is refused with INVALID_ARGUMENT naming both numbers.

Start-up is quiet: the process sets, before TensorFlow is imported and only where the user did not
set them, TF_CPP_MIN_LOG_LEVEL=3 and (when jax runs without CUDA) CUDA_VISIBLE_DEVICES="", so
TensorFlow's `failed call to cuInit` is not printed; the banners TensorFlow's libraries print while
they load (oneDNN, `Could not find cuda drivers`), before its logging reads that variable, are dropped
from the import's stderr (`pipo_jax/native_banners.py`); jax's backend probe (`Unable to initialize
backend 'tpu'`) is an INFO line of `jax._src`, kept below WARNING by `experiments/cli.py` as in every
experiments script.
"""

from __future__ import annotations

import importlib.util
import logging
import os

_JAX_CUDA_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13")


def _jax_may_use_cuda(environ) -> bool:
    """Whether this process's jax may run on an NVIDIA GPU (a CUDA plugin is installed and
    JAX_PLATFORMS, when set, allows cuda / gpu)."""
    platforms = environ.get("JAX_PLATFORMS", "").lower()
    if platforms and not any(p in platforms for p in ("cuda", "gpu")):
        return False
    for name in _JAX_CUDA_PLUGINS:
        try:
            if importlib.util.find_spec(name) is not None:
                return True
        except ImportError:  # jax_plugins itself absent
            continue
    return False


def tensorflow_environment(environ, jax_may_use_cuda: bool) -> dict[str, str]:
    """The variables to set before TensorFlow is imported (JetStream pulls it in through seqio, for
    tokenizers this server does not use), each only where the user did not set it:
    TF_CPP_MIN_LOG_LEVEL=3 (no C++ banners and no `failed call to cuInit` error line on a machine
    without a GPU driver), and, when jax runs without CUDA, CUDA_VISIBLE_DEVICES="" (TensorFlow
    then leaves any GPU alone instead of initialising it)."""
    wanted = {"TF_CPP_MIN_LOG_LEVEL": "3"}
    if not jax_may_use_cuda:
        wanted["CUDA_VISIBLE_DEVICES"] = ""
    return {k: v for k, v in wanted.items() if k not in environ}


# Before anything imports TensorFlow (experiments.serving imports JetStream, which imports it).
os.environ.update(tensorflow_environment(os.environ, _jax_may_use_cuda(os.environ)))

from absl import app, flags  # noqa: E402

from experiments import cli, conversation, serving  # noqa: E402

_POLICY = flags.DEFINE_string("policy", None, "training-run workdir or HF model directory", required=True)
_STEP = flags.DEFINE_integer("step", None, "checkpoint step of a run workdir (default: the newest that reads)")
_HOST = flags.DEFINE_string("host", "localhost", "interface to listen on (0.0.0.0 / [::] for every interface)")
_PORT = flags.DEFINE_integer("port", 9000, "gRPC port")
_SLOTS = flags.DEFINE_integer("slots", 4, "decode slots (requests decoded together)")
_MAX_PREFILL = flags.DEFINE_integer("max_prefill_length", 64, "longest prompt in tokens (a power of two >= 16)")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", None, "most tokens a request may ask for (default: the task's "
                                "answer width, a run's rollout.max_new_tokens, or generation_config.json's / 512)")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "sampling temperature (0 = greedy)")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "nucleus sampling mass (1 = off)")
_SEED = flags.DEFINE_integer("seed", 0, "sampling seed (request i uses fold_in(seed, i))")
_STYLE = flags.DEFINE_enum("prompt_style", "auto", ["auto", "instruct", "raw"],
                           "HF directories: chat template or the text as it is (auto: the template if there is one)")


def main(argv):
    del argv
    logging.basicConfig(level=logging.WARNING)
    # absl's handler is on the root logger at INFO; JetStream's orchestrator logs every step there.
    logging.getLogger().setLevel(logging.WARNING)
    m = _MAX_PREFILL.value
    if m < 16 or m > 32768 or m & (m - 1):
        raise app.UsageError(f"--max_prefill_length={m}: JetStream's prefill widths are powers of two in [16, 32768]")
    if _SLOTS.value < 1:
        raise app.UsageError(f"--slots={_SLOTS.value}: must be >= 1 (requests decoded together)")
    conversation.check_sampling_flags(_TEMPERATURE.value, _TOP_P.value, _MAX_NEW.value)
    serving.require_jetstream()  # before anything is loaded
    chat = conversation.make_chat(_POLICY.value, _STEP.value, max_new_tokens=_MAX_NEW.value,
                              temperature=_TEMPERATURE.value, top_p=_TOP_P.value, seed=_SEED.value,
                              prompt_style=_STYLE.value, max_prompt_tokens=_MAX_PREFILL.value)
    server = serving.serve(chat, port=_PORT.value, host=_HOST.value, slots=_SLOTS.value,
                           max_prefill_length=_MAX_PREFILL.value)
    print(f"serving {_POLICY.value} on {_HOST.value}:{_PORT.value} (JetStream gRPC, {_SLOTS.value} slots, "
          f"max_tokens <= {chat.max_new_tokens}); Ctrl-C to stop", flush=True)
    try:
        server.wait_for_termination()  # stops the server (and JetStream's threads) however it ends
    except KeyboardInterrupt:
        print("stopped", flush=True)


if __name__ == "__main__":
    cli.run(main)
