"""A policy served through JetStream (`google-jetstream`, the `[serve]` extra): its gRPC server
and orchestrator (`server_lib.run`, `orchestrator.Driver`) with this project's slot engine
(`pipo_jax/sampling/engine.py`) behind an adapter, `PolicyEngine`, that implements JetStream's
`engine_api.Engine`.

The adapter:
  - `prefill` runs the project's `Engine.prefill` (prompt re-padded to the engine's buckets; one
    request key `fold_in(seed, request number)`), which also samples the response's first token;
  - `generate` emits, per slot, the token sampled one step earlier (the prefix's first token in the
    first step after `insert`), because JetStream 0.2.2 takes every token from `generate`; so a
    request's tokens are the engine's, which are `sampler.generate`'s row for the same key;
  - `ResultTokens` carry (token, valid, tokens emitted so far) per slot; the orchestrator ends a
    request at a stop token (not sent) or after `max_tokens` tokens;
  - the decode cache is as wide as `max_len` from the start (no resizes: JetStream hands slots out
    itself, so the adapter does not track the longest request on the host).
`PolicyTokenizer` renders a text request as `experiments.chat` renders a line (`experiments.conversation`) (the built-in task: `47+85` ->
its prompt; a text policy: its chat template or the raw text); a token request is taken as it
is, after the policy's bos id that JetStream puts in front (`-1`, dropped by `prefill`, for a
policy without one). A request that cannot be rendered, or that does not fit (a prompt over
`max_prefill_length` tokens: `the prompt has N tokens, over the policy's max prompt length of M tokens`),
is refused with INVALID_ARGUMENT before it reaches the orchestrator's threads (which end the process on
an error); the refusal's text is cut to `MAX_ERROR_CHARS`, since gRPC sends it as trailing metadata
(8 KiB by default; a longer one reaches the client as RESOURCE_EXHAUSTED instead).

JetStream 0.2.2 beside jax >= 0.6: its orchestrator deletes a prefix with `jax.tree_map`, removed
from jax; the adapter replaces that one function of JetStream's orchestrator module
(`orchestrator.delete_pytree`) with one on `jax.tree.map` (jax itself is left as it is). Importing the
orchestrator sets the root logger to DEBUG and adds a stdout handler: both are undone right after
the import. Its server binds `[::]`; `serve` binds `host` (localhost by default) instead.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from experiments.conversation import Chat
from pipo_jax.tasks.chat_prompts import too_long
from experiments.cli import MissingExtra
from pipo_jax import native_banners
from pipo_jax.sampling.engine import DecodeState, Engine
from pipo_jax.sampling.sampling_params import SamplingParams

EXTRA_HINT = "pip install -e \".[serve]\" (google-jetstream)"
NO_BOS = -1  # the bos id given to JetStream for a policy without one (dropped again in prefill)

MAX_ERROR_CHARS = 1000  # a refusal's details travel as gRPC trailing metadata (8 KiB by default)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # JetStream pulls in TensorFlow (via seqio): no C++ banners
_root = logging.getLogger()
_level, _handlers = _root.level, list(_root.handlers)
try:
    with native_banners.banners_dropped():  # JetStream loads TensorFlow (via seqio): its load-time banners
        import grpc
        from jetstream.core import config_lib, orchestrator, server_lib
        from jetstream.core.proto import jetstream_pb2, jetstream_pb2_grpc
        from jetstream.engine import engine_api, tokenizer_api, tokenizer_pb2
    IMPORT_ERROR: ImportError | None = None
except ImportError as e:  # the [serve] extra is not installed
    IMPORT_ERROR = e
    engine_api = tokenizer_api = orchestrator = None
finally:
    _root.setLevel(_level)  # the orchestrator's import sets DEBUG and adds a stdout handler
    for _h in list(_root.handlers):
        if _h not in _handlers:
            _root.removeHandler(_h)

if orchestrator is not None:
    def _delete_pytree(p):
        """JetStream's `delete_pytree` on `jax.tree.map` (its `jax.tree_map` is gone from jax)."""
        jax.tree.map(lambda leaf: leaf.delete() if isinstance(leaf, jax.Array) else None, p)

    orchestrator.delete_pytree = _delete_pytree


def require_jetstream() -> None:
    """Raises `cli.MissingExtra` (one line naming the extra) when JetStream is not installed."""
    if IMPORT_ERROR is not None:
        raise MissingExtra(f"serving needs JetStream, which is not installed ({IMPORT_ERROR.name}): {EXTRA_HINT}")


class ServeState(NamedTuple):
    """The engine's slots plus, per slot, whether a sampled token awaits emission and how many were emitted."""

    engine: DecodeState
    pending_s: jax.Array  # bool [S]
    emitted_s: jax.Array  # int32 [S]


@jax.jit
def _emit(tokens_s, pending_s, emitted_s):
    lengths = emitted_s + pending_s.astype(jnp.int32)
    return jnp.stack([tokens_s, pending_s.astype(jnp.int32), lengths], axis=1), lengths


@jax.jit
def _inserted(pending_s, emitted_s, slot):
    return pending_s.at[slot].set(True), emitted_s.at[slot].set(0)


def _bucket(n: int, largest: int) -> int:
    """JetStream's prefill widths: powers of two from 16, capped at `largest`."""
    width = 16
    while width < n:
        width *= 2
    return min(width, largest)


_Base = engine_api.Engine if engine_api is not None else object
_TokBase = tokenizer_api.Tokenizer if tokenizer_api is not None else object


class PolicyTokenizer(_TokBase):
    """JetStream's tokenizer interface over a chat renderer (`experiments.conversation`)."""

    def __init__(self, chat: Chat, max_prefill_length: int):
        self.chat, self.max_prefill_length = chat, max_prefill_length

    def prompt_ids(self, text: str) -> list[int]:
        """The rendered prompt's ids; ValueError for a prompt the policy's task cannot render or too long."""
        tokens, mask, _ = self.chat.prompts.render(text, max_tokens=self.max_prefill_length)
        ids = [int(t) for t in np.asarray(tokens)[np.asarray(mask) == 1]]
        if len(ids) > self.max_prefill_length:
            raise ValueError(f"{too_long(len(ids), self.max_prefill_length)} (the server's --max_prefill_length)")
        return ids

    def encode(self, s: str, **kwargs) -> tuple[np.ndarray, int]:
        del kwargs  # the rendering decides about bos; padding is to JetStream's widths
        ids = self.prompt_ids(s)
        out = np.full((_bucket(len(ids), self.max_prefill_length),), self.pad_id, np.int32)
        out[: len(ids)] = ids
        return out, len(ids)

    def decode(self, token_ids: list[int], **kwargs) -> str:
        return self.chat.prompts.text(token_ids)

    @property
    def pad_id(self) -> int:
        return self.chat.pad_id

    @property
    def eos_id(self) -> int:
        return self.chat.stop_ids[0]

    @property
    def bos_id(self) -> int:
        bos = self.chat.prompts.bos_id
        return NO_BOS if bos is None else int(bos)

    @property
    def stop_tokens(self) -> set[int]:
        return set(self.chat.stop_ids)


class PolicyEngine(_Base):
    """JetStream's `engine_api.Engine` over this project's slot `Engine` (module docstring)."""

    def __init__(self, chat: Chat, *, slots: int, max_prefill_length: int, device=None):
        require_jetstream()
        self.chat = chat
        self.max_new_tokens = chat.max_new_tokens
        sampling = SamplingParams(temperature=chat.temperature, top_p=chat.top_p, max_new_tokens=chat.max_new_tokens,
                                  stop_token_ids=chat.stop_ids, pad_id=chat.pad_id)
        buckets = tuple(b for b in (16 << i for i in range(20)) if b < max_prefill_length) + (max_prefill_length,)
        self.engine = Engine(chat.model, sampling, max_concurrent_decodes=slots,
                             max_len=max_prefill_length + chat.max_new_tokens, prefill_buckets=buckets)
        self._max_prefill_length = max_prefill_length
        self._device = device or jax.devices()[0]
        self._requests = itertools.count()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ engine_api.Engine

    def load_params(self, *args, **kwargs):
        return self.engine.load_params(self.chat.params)

    def prefill(self, *, params, existing_prefix=None, padded_tokens, true_length: int):
        if existing_prefix is not None:
            raise NotImplementedError("PolicyEngine.prefill: session caches (existing_prefix) are not supported")
        ids = np.asarray(padded_tokens)[:true_length]
        ids = ids[ids != NO_BOS]
        tokens, length = self.engine.pad_to_bucket(ids)
        with self._lock:
            key = jax.random.fold_in(self.chat.rng, next(self._requests))
        return self.engine.prefill(params, tokens, length, key)

    def insert(self, prefix, decode_state: ServeState, slot: int) -> ServeState:
        engine_state = self.engine.insert(prefix, decode_state.engine, slot)
        return ServeState(engine_state, *_inserted(decode_state.pending_s, decode_state.emitted_s, jnp.int32(slot)))

    def generate(self, params, decode_state: ServeState):
        data, emitted = _emit(decode_state.engine.tokens_s, decode_state.pending_s, decode_state.emitted_s)
        engine_state, result = self.engine.generate(params, decode_state.engine)
        tokens = engine_api.ResultTokens(data=data, tokens_idx=(0, 1), valid_idx=(1, 2), length_idx=(2, 3),
                                         samples_per_slot=1)
        return ServeState(engine_state, result.valid_s, emitted), tokens

    def init_decode_state(self, *args, **kwargs) -> ServeState:
        s = self.engine.max_concurrent_decodes
        state = self.engine.init_decode_state(width=self.engine.width_for(self.engine.max_len - 1))
        return ServeState(state, jnp.zeros((s,), bool), jnp.zeros((s,), jnp.int32))

    def get_prefix_destination_sharding(self) -> Any:
        return jax.sharding.SingleDeviceSharding(self._device)

    def get_tokenizer(self):
        return tokenizer_pb2.TokenizerParameters(path="pipo_jax", extra_ids=0)

    def build_tokenizer(self, metadata) -> PolicyTokenizer:
        del metadata
        return PolicyTokenizer(self.chat, self._max_prefill_length)

    @property
    def max_concurrent_decodes(self) -> int:
        return self.engine.max_concurrent_decodes

    @property
    def samples_per_slot(self) -> int:
        return 1

    @property
    def max_prefill_length(self) -> int:
        return self._max_prefill_length

    @property
    def mesh(self):
        return jax.sharding.Mesh(np.array([self._device]), ("data",))

    @property
    def colocated_cpus(self):
        return None


def _checking_orchestrator(tokenizer: PolicyTokenizer, max_new_tokens: int):
    """JetStream's `LLMOrchestrator` that refuses a request it cannot serve before queueing it."""

    class CheckingOrchestrator(orchestrator.LLMOrchestrator):
        async def Decode(self, request, context=None):  # noqa: N802 (gRPC method name)
            problem = _request_problem(request, tokenizer, max_new_tokens)
            if problem is not None:
                problem = bounded(problem)
                if context is None:
                    raise ValueError(problem)
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
                return
            async for response in super().Decode(request, context):
                yield response

    return CheckingOrchestrator


def bounded(message: str, limit: int = MAX_ERROR_CHARS) -> str:
    """`message` cut to `limit` characters: a refusal's details are sent as gRPC trailing metadata,
    and a longer one reaches the client as RESOURCE_EXHAUSTED (metadata size) instead of the refusal."""
    return message if len(message) <= limit else message[: limit - 3] + "..."


def _request_problem(request, tokenizer: PolicyTokenizer, max_new_tokens: int) -> str | None:
    if request.max_tokens < 1:
        return f"max_tokens={request.max_tokens} must be >= 1"
    if request.max_tokens > max_new_tokens:
        return f"max_tokens={request.max_tokens} is more than the server's --max_new_tokens={max_new_tokens}"
    if request.session_cache:
        return "session_cache is not supported"
    which = request.WhichOneof("content")
    if which == "text_content":
        try:
            tokenizer.prompt_ids(request.text_content.text)
        except ValueError as e:
            return str(e)
        return None
    if which == "token_content":
        ids = list(request.token_content.token_ids)
        n = len(ids) + (tokenizer.bos_id != NO_BOS)
        if not ids:
            return "token_content is empty"
        if n > tokenizer.max_prefill_length:
            return f"{too_long(n, tokenizer.max_prefill_length)} (with bos; the server's --max_prefill_length)"
        bound = tokenizer.chat.model.vocab_size
        bad = [i for i in ids if not 0 <= i < bound]
        if bad:
            return f"token id {bad[0]} is outside the vocabulary [0, {bound})"
        return None
    return "the request has neither text_content nor token_content"


@contextlib.contextmanager
def _attributes(module, **values):
    old = {k: getattr(module, k) for k in values}
    for k, v in values.items():
        setattr(module, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(module, k, v)


def serve(chat: Chat, *, port: int, host: str = "localhost", slots: int = 4, max_prefill_length: int = 64,
          threads: int | None = None):
    """Starts JetStream's gRPC server (`server_lib.run`) on `host:port` with the policy behind a
    `PolicyEngine`; returns the running `JetStreamServer` (`stop()` it)."""
    require_jetstream()
    if not 16 <= max_prefill_length <= 32768 or max_prefill_length & (max_prefill_length - 1):
        raise ValueError(f"max_prefill_length={max_prefill_length}: JetStream's prefill widths are powers of two "
                         f"in [16, 32768]")
    device = jax.devices()[0]
    engine = PolicyEngine(chat, slots=slots, max_prefill_length=max_prefill_length, device=device)
    config = config_lib.ServerConfig(interleaved_slices=(f"{device.platform}=1",),
                                     interleaved_engine_create_fns=(lambda devices: engine,))
    checking = _checking_orchestrator(engine.build_tokenizer(None), chat.max_new_tokens)
    # JetStreamServer reads both names when it is built, inside run().
    with _attributes(server_lib, _HOST=host), _attributes(orchestrator, LLMOrchestrator=checking):
        return server_lib.run(port=port, config=config, devices=[device], threads=threads, jax_padding=False)


def client_decode(address: str, *, text: str | None = None, token_ids=None, max_tokens: int,
                  timeout: float = 120.0) -> tuple[list[int], str]:
    """One request to a JetStream server: (the streamed token ids, their text)."""
    require_jetstream()
    content = ({"text_content": jetstream_pb2.DecodeRequest.TextContent(text=text)} if text is not None else
               {"token_content": jetstream_pb2.DecodeRequest.TokenContent(token_ids=list(token_ids))})
    with grpc.insecure_channel(address) as channel:
        stub = jetstream_pb2_grpc.OrchestratorStub(channel)
        ids, pieces = [], []
        for response in stub.Decode(jetstream_pb2.DecodeRequest(max_tokens=max_tokens, **content), timeout=timeout):
            for sample in response.stream_content.samples:
                ids.extend(sample.token_ids)
                pieces.append(sample.text)
    return ids, "".join(pieces)
