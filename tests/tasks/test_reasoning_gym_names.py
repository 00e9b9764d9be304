"""An unknown reasoning-gym dataset name is one line with the close matches, or every name (runs without
the optional library: the names are given)."""

import pytest

from pipo_jax.tasks import reasoning_gym as rgt

NAMES = ("chain_sum", "gcd", "lcm", "products", "spell_backward")


def test_a_misspelt_name_gets_its_close_matches():
    assert rgt.unknown_dataset("lcmm", NAMES) == "dataset='lcmm' is not a reasoning-gym dataset; did you mean 'lcm'?"
    assert rgt.unknown_dataset("chainsum", NAMES) == ("dataset='chainsum' is not a reasoning-gym dataset; "
                                                      "did you mean 'chain_sum'?")


def test_a_name_like_none_lists_every_name_and_a_known_name_passes():
    assert rgt.unknown_dataset("zzz", reversed(NAMES)) == (
        "dataset='zzz' is not a reasoning-gym dataset; its 5 datasets: chain_sum, gcd, lcm, products, spell_backward")
    assert rgt.unknown_dataset("gcd", NAMES) is None


def test_the_library_refuses_lcmm_through_the_config():
    rg = pytest.importorskip("reasoning_gym", reason="reasoning-gym is an optional extra")
    assert "lcm" in rg.factory.DATASETS
    with pytest.raises(ValueError, match=r"^dataset='lcmm' is not a reasoning-gym dataset; did you mean 'lcm'"):
        rgt.generate_entries("lcmm", {}, 10, 0, 0.1)
