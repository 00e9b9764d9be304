"""Shared fixtures: tiny random Hugging Face Qwen3 checkpoints written to temp dirs; a guard
that frees compiled programs before a test process runs out of memory mappings; a persistent
XLA compilation cache shared by the test processes and the JAX subprocesses they start."""

import gc
import os
import time

import jax
import numpy as np
import pytest

from pipo_jax.run import compile_cache
from pipo_jax.tasks import code as code_sandbox
from tests import compilation_cache
from tests.xla_flags import xla_flags

# Read when JAX starts its CPU backend (at the first computation, after this import); the JAX
# subprocesses the tests start inherit it (tests/xla_flags.py).
os.environ["XLA_FLAGS"] = xla_flags()

# Every XLA:CPU executable keeps its JIT-compiled code in memory mappings for as long as a jit
# cache holds it; the programs of one trainer test take ~2,000 mappings. Linux caps a process at
# vm.max_map_count (65,530 by default) and XLA crashes (SIGSEGV in compile) past it, so one
# pytest process running the whole suite must drop its compiled programs now and then (a
# dropped program needed again loads from the persistent compilation cache below, not recompiled).
MAPS_LIMIT = 25_000
# Reading /proc/self/maps costs the kernel ~1.6 us a mapping (~40 ms at 25,000), more than most tests
# take, so the count is read once tests have run for `MAPS_CHECK_EVERY_S` since the last read (or after
# `MAPS_CHECK_EVERY_TESTS` tests): one compile adds a few mappings, a trainer test's ~2,000 take seconds,
# so the count cannot pass vm.max_map_count between two reads.
MAPS_CHECK_EVERY_S, MAPS_CHECK_EVERY_TESTS = 3.0, 16


# Tracing and lowering a trainer program make millions of short-lived Python objects, and each of
# CPython's full collections walks every object the process holds (jax, transformers, torch and the
# test modules, imported once; then the compiled programs the jit caches keep, with their jaxprs and
# lowerings): about a second in a worker half-way through the suite. Once the tests are collected,
# and again after each test file, what is alive is frozen out of the collections (`gc.freeze`), so
# a full collection walks only what the current file made; and the young generation is collected
# less often. Dropping the compiled programs unfreezes everything first (`_free_compiled_programs`).
GC_THRESHOLDS = (50_000, 20, 20)


def _freeze_survivors() -> None:
    """Collects, then moves every object still alive out of the collections' reach (`gc.freeze`)."""
    gc.collect()
    gc.freeze()


def pytest_collection_finish(session):
    _freeze_survivors()
    gc.set_threshold(*GC_THRESHOLDS)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    if nextitem is None or nextitem.path != item.path:  # the file's module fixtures are gone
        _freeze_survivors()


_REPAIRED = pytest.StashKey[int]()  # half-written cache files removed at the session start


# The persistent compilation cache: a program compiled once (in any xdist worker, any subprocess,
# or before `jax.clear_caches()` below) is loaded from disk instead of compiled again. It lives in
# the pytest cache (`.pytest_cache/d/jax_compilation_cache`), so the next run of the same code
# compiles nothing it compiled before; keys hash the HLO, XLA flags and jax/jaxlib versions, so
# an entry is never reused for a different program. A size cap switches on JAX's LRU eviction,
# which also takes a file lock around every read and write: xdist workers and subprocesses never
# read an entry another process is half-way through writing. The session starts by removing
# half-written entries, which would stop the cache from taking new ones
# (tests/compilation_cache.py).
def pytest_configure(config):
    cache = getattr(config, "cache", None)  # None under `-p no:cacheprovider`
    path = str(cache.mkdir("jax_compilation_cache")) if cache is not None else compilation_cache.FALLBACK_DIR
    settings = dict(compilation_cache.SETTINGS, jax_compilation_cache_dir=path)
    # The user's own cache setting (pipo_jax/run/compile_cache.py) would win over JAX_COMPILATION_CACHE_DIR
    # in the commands the tests start: the tests' cache is theirs.
    os.environ.pop(compile_cache.ENV, None)
    for name, value in settings.items():
        jax.config.update(name, value)
        os.environ[name.upper()] = str(value)  # read by the JAX subprocesses the tests start
    if not hasattr(config, "workerinput"):  # the controller (or the only process), before any worker
        config.stash[_REPAIRED] = compilation_cache.repair(path)
        if cache is not None and _whole_suite(config):
            config.pluginmanager.register(FileSeconds(cache), "pipo_jax_file_seconds")


def pytest_report_header(config):
    removed = config.stash.get(_REPAIRED, 0)
    return [f"compilation cache: removed {removed} half-written entry file(s)"] if removed else []


def _memory_mappings() -> int:
    try:
        with open("/proc/self/maps", "rb") as f:
            return f.read().count(b"\n")
    except OSError:  # not Linux
        return 0


@pytest.fixture(autouse=True)
def _free_compiled_programs():
    start = time.monotonic()
    yield
    _since_maps_read["s"] += time.monotonic() - start
    _since_maps_read["tests"] += 1
    if _since_maps_read["s"] < MAPS_CHECK_EVERY_S and _since_maps_read["tests"] < MAPS_CHECK_EVERY_TESTS:
        return
    _since_maps_read.update(s=0.0, tests=0)
    if _memory_mappings() > MAPS_LIMIT:
        gc.unfreeze()  # a dropped program held in a reference cycle is freed by the collection below
        jax.clear_caches()
        _freeze_survivors()


_since_maps_read = {"s": 0.0, "tests": 0}  # test seconds and tests since the last read of the mappings


@pytest.fixture(autouse=True)
def _sandbox_where_the_kernel_has_no_landlock(request, monkeypatch):
    """Without Landlock (or without network namespaces) the code sandbox refuses to run
    generated code; that refusal is tested where a module sets SANDBOX_REFUSAL_TESTED
    (tests/tasks/test_sandbox_confinement.py, test_sandbox_hacks.py). Every other test runs the
    sandbox unconfined (or without a namespace) there, as `allow_unconfined=True`
    (`allow_network=True`) would."""
    if not getattr(request.module, "SANDBOX_REFUSAL_TESTED", False):
        if code_sandbox.landlock_abi() == 0:
            monkeypatch.setattr(code_sandbox, "check_confinement", lambda config: False)
        if not code_sandbox.namespaces_available():
            monkeypatch.setattr(code_sandbox, "check_network_isolation", lambda config: False)
    yield


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


# The order files are handed to the xdist workers: longest first, so that no long file starts while
# the other worker has nothing left to do. Seconds per file as the previous run on this checkout
# measured them (kept in the pytest cache, `FILE_SECONDS_KEY`); for a file it has not timed (a fresh
# clone, as CI), `LONG_FILES`: the files over 10 s of a fresh clone's `.ci/run` (cold compilation cache,
# the 2-core AMD EPYC machine, two workers; the latest run; reasoning-gym's, which
# needs the `rg` extra, from a run with it). A long file missing here is handed out in collection order,
# and one that comes last keeps one worker busy while the other has nothing left to do.
FILE_SECONDS_KEY = "pipo_jax/file_seconds"
LONG_FILES = {
    "tests/test_main_job_reproduces.py": 149, "tests/rl/test_trainer.py": 143, "tests/test_compare.py": 61,
    "tests/test_full_disk_during_a_run.py": 49, "tests/benchmarks/test_readiness.py": 42, "tests/rl/test_hyper.py": 41,
    "tests/parallel/test_sharded_training.py": 37, "tests/parallel/test_trainer_on_mesh.py": 36,
    "tests/test_experiments.py": 35, "tests/test_preemption.py": 31, "tests/test_cli_errors.py": 27,
    "tests/models/test_layer_loop.py": 23, "tests/test_compile_cache.py": 23, "tests/rl/test_dataset_task.py": 22,
    "tests/rl/test_warmup.py": 22, "tests/rl/test_sdpo_mask.py": 22, "tests/tasks/test_sandbox_escapes.py": 21,
    "tests/parallel/test_multiprocess.py": 21, "tests/kernels/test_logprobs.py": 20, "tests/rl/test_algorithms.py": 19,
    "tests/rl/test_export.py": 17, "tests/tasks/test_arithmetic.py": 17, "tests/sampling/test_decode.py": 16,
    "tests/rl/test_pipo_variants.py": 16, "tests/sampling/test_engine.py": 15, "tests/rl/test_warmup_contexts.py": 14,
    "tests/sampling/test_sampler.py": 14, "tests/run/test_metric_keys_run.py": 13, "tests/tasks/test_code.py": 13,
    "tests/tasks/test_sandbox_reliability.py": 12, "tests/rl/test_run_guards.py": 12,
    "tests/benchmarks/test_device_check.py": 11, "tests/tasks/test_math_batch_deadline.py": 11,
    "tests/test_study.py": 11, "tests/parallel/test_micro_batch_per_device.py": 11, "tests/rl/test_vpd_steps.py": 10,
    "tests/kernels/test_target_platform.py": 10,
    "tests/tasks/test_reasoning_gym.py": 100,
}


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


# The edit-test tier (`-m quick`): every test that is neither marked `slow` nor in a file of `LONG_FILES`, so each
# package keeps its cheap tests (`tests/test_quick_tier.py` holds that) and a fresh clone runs the tier in about 2.3
# minutes on 2 cores (docs/testing.md). A file over 10 s drops out of it once `LONG_FILES` lists it.
QUICK = "quick"


def is_quick(item) -> bool:
    """Whether `item` belongs to the edit-test tier: not marked `slow`, its file not in `LONG_FILES`."""
    return item.get_closest_marker("slow") is None and _file(item.nodeid) not in LONG_FILES


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the marks
def pytest_collection_modifyitems(config, items):
    """Marks the edit-test tier `quick`; orders files by their seconds (longest first), the untimed rest after
    them in collection order."""
    for item in items:
        if is_quick(item):
            item.add_marker(QUICK)
    cache = getattr(config, "cache", None)
    seconds = dict(LONG_FILES, **(cache.get(FILE_SECONDS_KEY, {}) if cache is not None else {}))
    first_index = {}
    for i, item in enumerate(items):
        first_index.setdefault(_file(item.nodeid), i)
    items.sort(key=lambda item: (-seconds.get(_file(item.nodeid), 0), first_index[_file(item.nodeid)]))


def _whole_suite(config) -> bool:
    """Whether this run is the whole suite (no -k / -m selection, the tests folder or no path):
    a run of part of a file must not store that part's seconds as the file's."""
    tests_dir = os.path.join(str(config.rootpath), "tests")
    return not config.option.keyword and not config.option.markexpr and all(
        os.path.abspath(arg) == tests_dir for arg in (config.args or ["tests"]))


class FileSeconds:
    """Times the files of a whole-suite run (in the controller: xdist forwards the workers' reports)
    and stores them beside those of earlier runs, for the next run's order."""

    def __init__(self, cache):
        self.cache, self.seconds = cache, {}

    def pytest_runtest_logreport(self, report):  # setup, call and teardown each add their duration
        self.seconds[_file(report.nodeid)] = self.seconds.get(_file(report.nodeid), 0.0) + report.duration

    def pytest_sessionfinish(self):
        if self.seconds:
            stored = self.cache.get(FILE_SECONDS_KEY, {})
            self.cache.set(FILE_SECONDS_KEY, dict(stored, **{f: round(s, 1) for f, s in self.seconds.items()}))


def override(config, overrides: dict):
    """Sets dotted keys of an ml-collections config (`{"pipo.lam": 0.2}`), as the command line does."""
    for key, value in overrides.items():
        node = config
        *path, last = key.split(".")
        for p in path:
            node = node[p]
        node[last] = value
    return config
