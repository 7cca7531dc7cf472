"""The arrival guard's finiteness check: one read per leaf, NaN and Inf caught in every dtype."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from jaxsync._src.rules import guard


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("bad", [jnp.nan, jnp.inf, -jnp.inf])
def test_a_nan_or_inf_anywhere_in_any_float_dtype_is_caught(dtype, bad):
  leaf = jnp.ones([1000], dtype).at[617].set(bad)
  assert not bool(guard.tree_all_finite({"ok": jnp.ones([3], jnp.float32), "bad": leaf}))
  assert bool(guard.tree_all_finite({"ok": jnp.ones([3], jnp.float32), "good": jnp.ones([1000], dtype)}))


def test_opposite_infinities_do_not_cancel():
  leaf = jnp.zeros([8], jnp.float32).at[1].set(jnp.inf).at[5].set(-jnp.inf)
  assert not bool(guard.tree_all_finite([leaf]))


def test_a_half_precision_leaf_whose_own_sum_would_overflow_is_still_finite():
  # 70,000 ones sum past float16's largest value (65,504); summed in float32 they are finite, as they are.
  assert bool(guard.tree_all_finite([jnp.ones([70_000], jnp.float16)]))


def test_an_empty_tree_or_empty_leaves_are_finite():
  assert bool(guard.tree_all_finite({})) and bool(guard.tree_all_finite([jnp.zeros([0])]))
