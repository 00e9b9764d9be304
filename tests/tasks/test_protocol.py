"""The task seam (`tasks/protocol.py`, `tasks/registry.py`, `run/task_config.py`): a task that
forgets a required member cannot be built, an optional member it lacks names its capability, the
registry's errors are one line naming the key, and a config that needs a capability the task
lacks is refused at start-up naming the key."""

import dataclasses
import re
from typing import ClassVar

import jax.numpy as jnp
import pytest

from configs import gdpo, grpo, sdpo
from pipo_jax.rl import spec as spec_lib
from pipo_jax.config import registry as config_registry
from pipo_jax.config.sections import ConfigError, RunConfig
from pipo_jax.run.setup import make_model_config
from pipo_jax.tasks import registry
from pipo_jax.tasks.protocol import Task, TaskCapabilities, missing_attributes, missing_members
from tests.typed import spec_of, task_of


@dataclasses.dataclass(frozen=True)
class Bare(Task):
    """The required members only: no capability."""

    name: ClassVar[str] = "bare"
    capabilities: ClassVar[TaskCapabilities] = TaskCapabilities()
    prompt_len: ClassVar[int] = 4
    answer_len: ClassVar[int] = 4
    stop_token_ids: ClassVar[tuple[int, ...]] = (2,)
    pad_id: ClassVar[int] = 0
    token_id_bound: ClassVar[int] = 30
    train_size: ClassVar[int] = 0

    def prompt_table(self):
        return None

    def sample_problems(self, table, rng, n, split="train"):
        return {"prompt_tokens_bp": jnp.ones((n, 4), jnp.int32), "prompt_mask_bp": jnp.ones((n, 4), jnp.int32)}

    def heldout_problems(self, table, n, rng):
        return self.sample_problems(table, rng, n)

    def scorer(self):
        raise NotImplementedError  # not reached here


def test_a_task_missing_a_required_member_cannot_be_built():
    class NoReward(Task):
        name = "x"

    assert "sample_problems" in missing_members(NoReward) and "capabilities" in missing_members(NoReward)
    with pytest.raises(TypeError, match="abstract"):
        NoReward()
    with pytest.raises(TypeError, match=r"does not implement \(.*'sample_problems'"):
        registry.check_task_class(NoReward, "NoReward")
    registry.check_task_class(Bare, "Bare")  # complete


def test_every_registered_task_class_is_complete_and_keeps_its_capabilities_promises():
    for name in registry.TASKS:
        registry.constructor(name)  # imports the module, checks its classes
    assert missing_attributes(Bare()) == ()

    @dataclasses.dataclass(frozen=True)
    class Promises(Bare):
        capabilities: ClassVar[TaskCapabilities] = TaskCapabilities(device_reward=True, teacher_contexts=True,
                                                                    warmup=True)

    assert missing_attributes(Promises()) == ("device_reward -> reward", "warmup -> reference_responses",
                                              "teacher_contexts -> teacher_prompts")

    @dataclasses.dataclass(frozen=True)
    class Parts(Bare):
        capabilities: ClassVar[TaskCapabilities] = TaskCapabilities(reward_components=True)

    assert missing_attributes(Parts()) == ("reward_components -> reward_weights",
                                           "reward_components -> reward_components")


def test_optional_members_name_the_capability_they_need():
    task = Bare()
    with pytest.raises(ValueError, match=r"the bare task has no JAX reward.*capabilities\.device_reward is False"):
        task.reward(None, None, None)
    with pytest.raises(ValueError, match=r"capabilities\.teacher_contexts is False"):
        task.teacher_prompts(None, None, None, None)
    assert task.teacher_eval_problems(None, 2, None) == {}


def test_registry_errors_are_one_line_naming_the_key(monkeypatch):
    c = grpo.get_config("micro")
    c.task.name = "no_such_task"
    names = re.escape(repr(tuple(registry.TASKS)))
    assert names.startswith(re.escape("('arithmetic', 'countdown', 'math', 'code', 'reasoning_gym'"))
    # The name is a registered choice of the schema: checked when the config is parsed.
    with pytest.raises(ConfigError, match=rf"^config\.task\.name: 'no_such_task' is not one of {names}$"):
        task_of(c)
    monkeypatch.setitem(registry.TASKS, "needs_extra", registry.TaskEntry(
        "needs_extra", "pipo_jax.tasks.no_such_module", ("X",), extra="xyz"))
    monkeypatch.setitem(config_registry._NAMES["task"], "needs_extra", None)
    c.task.name = "needs_extra"
    with pytest.raises(ConfigError, match=r"^config\.task\.name: task\.name=needs_extra needs the optional extra: "
                                          r"pip install -e \"\.\[xyz\]\""):
        task_of(c)
    with pytest.raises(ValueError, match="registered twice"):
        registry.register_task(registry.TASKS["arithmetic"])


def spec_from(c, task):
    run = RunConfig.from_config(c)
    return spec_lib.spec_from_config(run, make_model_config(run.model, task), task)


def test_a_config_needing_a_capability_the_task_lacks_names_the_key():
    c = grpo.get_config("micro")
    task = Bare()
    with pytest.raises(ConfigError, match=r"^config\.warmup\.enabled: the bare task has no reference responses"):
        spec_lib.check_run_config(RunConfig.from_config(c), task)
    c.warmup.enabled = False
    spec_lib.check_run_config(RunConfig.from_config(c), task)
    c.eval.benchmarks = "m=x.jsonl"
    with pytest.raises(ConfigError, match=r"^config\.eval\.benchmarks: math benchmarks need .* the bare task has none"):
        spec_lib.check_run_config(RunConfig.from_config(c), task)
    s = sdpo.get_config("micro")
    with pytest.raises(ConfigError, match=r"^config\.algorithm: sdpo needs teacher contexts \(SDPO / VPD teacher "
                                          r"prompts\), which the bare task does not have; use one of "
                                          r"\('ppo', 'grpo', "):
        spec_from(s, task)
    spec_from(c, task)  # grpo needs none
    g = gdpo.get_config("micro")
    with pytest.raises(ConfigError, match=r"^config\.advantage\.estimator: 'gdpo' normalises each component of the "
                                          r"reward, which the bare task does not expose "
                                          r"\(TaskCapabilities\.reward_components\)$"):
        spec_from(g, task)
    with pytest.raises(ValueError, match=r"the bare task has no reward components \(capabilities\.reward_components"):
        task.reward_weights()


def test_the_built_in_tasks_declare_their_capabilities():
    arithmetic = spec_of(grpo.get_config("micro")).task
    assert arithmetic.capabilities == TaskCapabilities(device_reward=True, exact_answers=True, teacher_contexts=True,
                                                       warmup=True, reward_components=True)
