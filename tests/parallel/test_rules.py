"""Mesh sizes, the rules table, PartitionSpecs with divisibility fallback, and the
shardings of params / optimizer state / critic / PIPO state / KV cache (abstract 2x2x2 mesh)."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import optax
import pytest
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P

from pipo_jax import parallel
from pipo_jax.models import qwen3
from pipo_jax.config.sections import MeshConfig
from pipo_jax.parallel.mesh import resolve_sizes
from pipo_jax.rl import controller
from pipo_jax.rl.batch import TrainBatch
from pipo_jax.sampling import decode
from tests.typed import spec_of

MESH = AbstractMesh((2, 2, 2), parallel.AXES)


def spec_tree(shardings):
    """The PartitionSpecs of a tree of NamedShardings."""
    return jax.tree.map(lambda s: s.spec, shardings, is_leaf=lambda s: isinstance(s, NamedSharding))


@pytest.mark.parametrize("spec, n, expected", [
    (MeshConfig(data=-1, fsdp=1, tensor=1), 8, (8, 1, 1)),
    (MeshConfig(data=2, fsdp=-1, tensor=2), 8, (2, 2, 2)),
    (MeshConfig(data=1, fsdp=2, tensor=-1), 8, (1, 2, 4)),
    (MeshConfig(data=2, fsdp=2, tensor=2), 8, (2, 2, 2)),
    (MeshConfig(data=-1, fsdp=2, tensor=1, dcn_data=2), 8, (4, 2, 1)),
])
def test_resolve_sizes(spec, n, expected):
    assert resolve_sizes(spec, n) == expected


@pytest.mark.parametrize("spec, n, field", [
    (MeshConfig(data=-1, fsdp=-1, tensor=1), 8, "only one"),
    (MeshConfig(data=3, fsdp=-1, tensor=1), 8, "not divisible"),
    (MeshConfig(data=2, fsdp=2, tensor=1), 8, "4, but there are 8 devices"),
    (MeshConfig(data=0, fsdp=1, tensor=1), 8, "mesh.data=0"),
    (MeshConfig(data=2, fsdp=4, tensor=1, dcn_fsdp=3), 8, "dcn_fsdp=3"),
])
def test_resolve_sizes_errors_name_the_field(spec, n, field):
    with pytest.raises(ValueError, match=field):
        resolve_sizes(spec, n)


def test_mesh_from_the_typed_section_and_its_defaults():
    assert MeshConfig.from_config({"tensor": 4}) == MeshConfig(data=-1, fsdp=1, tensor=4, dcn_data=1, dcn_fsdp=1)
    mesh = parallel.mesh_from_config(MeshConfig())
    assert parallel.mesh_sizes(mesh) == {"data": jax.device_count(), "fsdp": 1, "tensor": 1}


def test_spec_for_maps_logical_names_and_falls_back(caplog):
    assert parallel.spec_for(("vocab", "embed"), (256, 64), MESH) == P("tensor", "fsdp")
    assert parallel.spec_for(("batch", None), (8, 3), MESH) == P(("data", "fsdp"), None)
    with caplog.at_level(logging.WARNING, logger="pipo_jax.parallel.rules"):
        # 6 rows: data (2) divides, data x fsdp (4) does not -> only data.
        assert parallel.spec_for(("batch", None), (6, 5), MESH) == P("data", None)
        # 3 kv heads on tensor=2: replicated.
        assert parallel.spec_for(("kv_heads",), (3,), MESH) == P(None)
    assert "not divisible" in caplog.text
    # a mesh axis is used once per array: the second 'fsdp' dim stays whole
    assert parallel.spec_for(("embed", "embed"), (4, 4), MESH) == P("fsdp", None)
    # size-1 mesh axes split nothing and are left out
    assert parallel.spec_for(("batch",), (8,), AbstractMesh((8, 1, 1), parallel.AXES)) == P("data")


def test_rules_overrides_and_errors():
    rules = parallel.make_rules("embed=none; mlp=fsdp+tensor")
    assert rules["embed"] is None and rules["mlp"] == ("fsdp", "tensor")
    assert parallel.spec_for(("embed", "mlp"), (64, 128), MESH, rules) == P(None, ("fsdp", "tensor"))
    with pytest.raises(ValueError, match="unknown logical axes"):
        parallel.make_rules({"embedding": "fsdp"})
    with pytest.raises(ValueError, match="not a mesh axis"):
        parallel.make_rules({"embed": "model"})
    with pytest.raises(ValueError, match="not name=axes"):
        parallel.parse_rules("embed")
    with pytest.raises(ValueError, match="no sharding rule"):
        parallel.spec_for(("nonsense",), (4,), MESH)


def _tiny():
    return qwen3.preset("tiny")  # V 256, D 64, F 128, 4 heads, 2 kv heads


def test_param_and_optimizer_state_shardings():
    cfg = _tiny()
    params = jax.eval_shape(lambda: qwen3.init_params(cfg, jax.random.PRNGKey(0)))
    sh = parallel.tree_shardings(params, qwen3.param_axes(cfg), MESH)
    specs = spec_tree(sh)
    assert specs["embed"] == P("tensor", "fsdp")
    assert specs["layers"]["q_proj"] == P(None, "fsdp", "tensor", None)
    assert specs["layers"]["down_proj"] == P(None, "tensor", "fsdp")
    assert specs["layers"]["q_norm"] == P(None, None)
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.inject_hyperparams(optax.adamw)(learning_rate=1e-3))
    state = jax.eval_shape(opt.init, params)
    opt_specs = spec_tree(parallel.mirror_shardings(state, params, sh, MESH))
    adam = opt_specs[1].inner_state[0]
    assert adam.mu == specs and adam.nu == specs
    assert adam.count == P() and opt_specs[1].hyperparams["learning_rate"] == P()


def test_critic_pipo_and_cache_shardings():
    cfg = _tiny()
    critic = {"backbone": jax.eval_shape(lambda: qwen3.init_params(cfg, jax.random.PRNGKey(0))),
              "value_head": jax.ShapeDtypeStruct((cfg.hidden_size,), jnp.float32)}
    c_axes = parallel.critic_axes(qwen3.param_axes(cfg))
    c_specs = spec_tree(parallel.tree_shardings(critic, c_axes, MESH))
    assert c_specs["value_head"] == P("fsdp") and c_specs["backbone"]["embed"] == P("tensor", "fsdp")

    f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)  # noqa: E731
    stored = TrainBatch(tokens_bl=f32(8, 11), mask_bl=f32(8, 11), mask_br=f32(8, 4),
                        logp_old_br=f32(8, 4), logp_ref_br=f32(8, 4), attr_br=f32(8, 4))
    ps = jax.eval_shape(lambda: controller.init_pipo_state(4, stored))
    p_specs = spec_tree(parallel.pipo_state_shardings(ps, MESH))
    assert p_specs.mu_window_k == P(None) and p_specs.count == P()
    assert p_specs.prev.tokens_bl == P(("data", "fsdp"), None)

    cache = jax.eval_shape(lambda: qwen3.init_cache(cfg, 4, 16))
    k_spec = parallel.tree_shardings(cache, qwen3.KVCache(decode.KV_CACHE_AXES, decode.KV_CACHE_AXES), MESH).k.spec
    assert k_spec == P(None, ("data", "fsdp"), "tensor", None, None)  # [L, B, K, S, Dh]


@pytest.mark.parametrize("algo", ["ppo", "grpo", "gspo", "dapo", "sdpo", "vpd", "bnpo"])
def test_train_state_shardings_cover_every_algorithm(algo):
    """Every leaf of every algorithm's TrainState (critic, teacher, VPD state, BNPO's pool, ...) gets a
    sharding; the advantage estimator's carried state is replicated."""
    import importlib

    from pipo_jax.run import sharded_steps as steps

    c = importlib.import_module(f"configs.{algo}").get_config("micro")
    c.pipo.enabled = True
    spec = spec_of(c)
    abstract = steps.abstract_train_state(spec)
    sh = steps.state_shardings(spec, MESH)
    ok = jax.tree.leaves(jax.tree.map(lambda a, s: isinstance(s, NamedSharding) and len(s.spec) <= a.ndim,
                                      abstract, sh))
    assert len(ok) == len(jax.tree.leaves(abstract)) and all(ok)
    embed = spec_tree(sh.params)["embed"]
    assert embed == P("tensor", "fsdp")
    if abstract.critic is not None:
        assert spec_tree(sh.critic["params"]["backbone"])["embed"] == embed
    if abstract.teacher_params is not None:
        assert spec_tree(sh.teacher_params)["embed"] == embed
    assert (abstract.estimator_state is None) == (algo != "bnpo")
    assert all(s == P() for s in jax.tree.leaves(spec_tree(sh.estimator_state)))
    assert len(jax.tree.leaves(sh.estimator_state)) == (4 if algo == "bnpo" else 0)
