"""`experiments/serve.py`: a policy served through JetStream's gRPC server (`server_lib.run`, its
orchestrator) with the project's slot engine behind the `PolicyEngine` adapter. Concurrent
requests (more than slots; text and token requests; short `max_tokens`) stream the tokens of
`sampler.generate`; bad requests are refused without stopping the server; without the `[serve]`
extra the command fails in one line naming it. JetStream (and the TensorFlow it imports, ~15 s)
is imported inside the tests, never at collection."""

import concurrent.futures
import os
import pathlib
import re
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from configs import grpo
from pipo_jax.data import char_vocab as cv
from pipo_jax.models import qwen3
from pipo_jax.sampling import sampler
from pipo_jax.sampling.sampling_params import SamplingParams
from pipo_jax.tasks import arithmetic
from tests import test_startup_noise
from tests.typed import spec_of

ROOT = pathlib.Path(__file__).resolve().parents[1]
TEXTS = ["3+4", "12+5", "9-7", "40+40", "1+1", "99+99", "50-25", "7+0"]
# Several stop ids on a random model: responses end at varied lengths, slots are refilled.
STOPS = (cv.EOS_ID, cv.TOKEN_TO_ID["+"], cv.TOKEN_TO_ID["<solution>"], cv.TOKEN_TO_ID["4"])
MAX_NEW = 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def policy():
    spec = spec_of(grpo.get_config("micro"))
    params = qwen3.init_params(spec.model, jax.random.PRNGKey(3), std=0.3)
    return spec, params


def _reference(spec, params, texts, stops=STOPS, max_new=MAX_NEW):
    """`sampler.generate`'s greedy responses to the task's prompts of `texts` (stop token cut off)."""
    parsed = [re.match(r"(\d+)([-+*])(\d+)", t).groups() for t in texts]
    problems = arithmetic.make_problems(spec.task, *(np.array(c) for c in zip(
        *[(int(a), cv.OPERATORS.index(op), int(b)) for a, op, b in parsed])))
    out = sampler.generate(spec.model, params, problems.prompt_tokens_bp, problems.prompt_mask_bp,
                           jax.random.PRNGKey(0),
                           SamplingParams(max_new_tokens=max_new, temperature=0.0, stop_token_ids=stops,
                                          pad_id=spec.task.pad_id))
    rows = [list(map(int, t[m == 1])) for t, m in zip(np.asarray(out.tokens_br), np.asarray(out.mask_br))]
    return [r[:-1] if r[-1] in stops else r for r in rows], problems


@pytest.mark.slow  # imports JetStream / TensorFlow, compiles the engine (~40 s on a loaded 2-core CPU)
def test_concurrent_requests_stream_the_samplers_tokens(policy):
    pytest.importorskip("jetstream", reason="the [serve] extra (google-jetstream) is not installed")
    import grpc
    from jetstream.core import orchestrator, server_lib

    from experiments import serving  # first: it undoes the logging changes of JetStream's import
    from experiments.conversation import Chat
    from pipo_jax.tasks.arithmetic_chat import ArithmeticPrompts

    spec, params = policy
    chat = Chat(spec.model, params, ArithmeticPrompts(spec.task), stop_ids=STOPS, pad_id=spec.task.pad_id,
                max_new_tokens=MAX_NEW)
    expected, problems = _reference(spec, params, TEXTS)
    assert len({len(r) for r in expected}) >= 3  # varied lengths: slots free up at different steps
    port = _free_port()
    server = serving.serve(chat, port=port, slots=4, max_prefill_length=16)
    try:
        assert server_lib._HOST == "[::]" and orchestrator.LLMOrchestrator.__name__ == "LLMOrchestrator"
        address = f"localhost:{port}"
        # 8 requests on 4 slots: text requests rendered by the server, token requests as sent (the
        # server puts <bos> in front), two cut short by max_tokens.
        requests = []
        for i, text in enumerate(TEXTS):
            ids = [int(t) for t, m in zip(np.asarray(problems.prompt_tokens_bp[i]),
                                         np.asarray(problems.prompt_mask_bp[i])) if m][1:]
            kw = dict(text=text) if i % 2 == 0 else dict(token_ids=ids)
            requests.append(dict(kw, max_tokens=3 if i in (1, 4) else MAX_NEW))
        with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
            got = list(pool.map(lambda kw: serving.client_decode(address, **kw), requests))
        for i, ((ids, text), want) in enumerate(zip(got, expected)):
            want = want[:3] if i in (1, 4) else want
            assert ids == want, (i, ids, want)
            # Text requests stream text too; token requests (client-side tokenization) ids only.
            assert text == (ArithmeticPrompts.text(want) if i % 2 == 0 else "")
        # A request the task cannot render is refused; the server keeps serving.
        with pytest.raises(grpc.RpcError) as refused:
            serving.client_decode(address, text="hello", max_tokens=4)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a problem of the arithmetic task" in refused.value.details()
        # A 100k-character prompt: refused naming the limit (not gRPC's RESOURCE_EXHAUSTED on the
        # refusal's metadata size).
        with pytest.raises(grpc.RpcError) as refused:
            serving.client_decode(address, text="1" * 100_000 + "+1", max_tokens=4)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details() == ("the prompt has 100004 tokens, over the policy's max prompt length of "
                                           "16 tokens")
        with pytest.raises(grpc.RpcError, match="more than the server's --max_new_tokens=8"):
            serving.client_decode(address, text="3+4", max_tokens=9)
        assert serving.client_decode(address, text=TEXTS[0], max_tokens=MAX_NEW)[0] == expected[0]
    finally:
        server.stop()


def test_importing_the_adapter_leaves_the_root_logger_alone():
    import logging

    before = (logging.getLogger().level, list(logging.getLogger().handlers))
    # experiments.conversation first: orbax's import adds a stderr handler of its own.
    code = ("import logging, experiments.conversation; root = logging.getLogger(); before = (root.level, list(root.handlers)); "
            "import experiments.serving as s; assert (root.level, list(root.handlers)) == before, root.handlers; "
            "print('jetstream' if s.IMPORT_ERROR is None else 'missing')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() in ("jetstream", "missing")
    assert (logging.getLogger().level, list(logging.getLogger().handlers)) == before


def test_without_the_extra_the_command_fails_in_one_line(tmp_path):
    code = ("import sys, runpy; sys.modules['jetstream'] = None; "
            f"sys.argv = ['serve', '--policy={tmp_path}']; runpy.run_module('experiments.serve', run_name='__main__')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert res.returncode == 2, res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install -e \".[serve]\"" in lines[0] and lines[0].startswith("error: ")


@pytest.mark.slow  # a server process (JetStream import ~15 s) on an exported policy directory
def test_serve_command_on_an_exported_policy(policy, tmp_path):
    pytest.importorskip("jetstream", reason="the [serve] extra (google-jetstream) is not installed")
    from experiments import serving
    from pipo_jax.run import export
    spec, params = policy
    out = export.write_export(str(tmp_path / "policy"), spec.model, params, spec=spec)
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "experiments.serve", f"--policy={out}", f"--port={port}",
                             "--slots=2", "--max_prefill_length=16"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        line = proc.stdout.readline()
        assert f"on localhost:{port}" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        # An HF directory of the built-in task: no chat template, so the text is the prompt as it is.
        expected, _ = _reference(spec, params, ["3+4", "12+5"], stops=(cv.EOS_ID,), max_new=spec.task.answer_len)
        for text, want in zip(["<bos>3+4=", "<bos>12+5="], expected):
            ids, _ = serving.client_decode(f"localhost:{port}", text=text, max_tokens=spec.task.answer_len)
            assert ids == want
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    # no TensorFlow load-time banners (JetStream imports TensorFlow), no jax backend probe
    noise = [line for line in proc.stderr.read().splitlines() if any(n in line for n in test_startup_noise.NOISE)]
    assert noise == []
