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


def test_scalars_computed_once_keep_every_value_and_dtype_bit_for_bit():
  import jax
  import numpy as np

  values = [
    jnp.float32(np.nan),
    jnp.float32(-0.0),
    jnp.float32(np.inf),
    jnp.float32(3.4e38),
    jnp.bfloat16(1.5),
    jnp.float16(-3),
    jnp.int32(-(2**31)),
    jnp.int32(2**31 - 1),
    jnp.uint32(2**32 - 1),
    jnp.bool_(True),
    jnp.bool_(False),
    jnp.int8(-5),
  ]
  kept = jax.jit(guard.computed_once)(*values)
  for given, got in zip(values, kept):
    assert got.dtype == given.dtype
    assert np.asarray(got).tobytes() == np.asarray(given).tobytes(), (given, got)


def test_scalars_computed_once_pass_gradients_and_batch_under_vmap():
  import jax

  assert float(jax.grad(lambda lr: guard.computed_once(2.0 * lr)[0] * 3.0)(0.1)) == 6.0
  rates, counts = jax.vmap(guard.computed_once)(jnp.arange(3.0), jnp.arange(3))
  assert rates.tolist() == [0.0, 1.0, 2.0] and counts.tolist() == [0, 1, 2]


def test_tree_sums_and_norms_add_every_leaf_and_norms_accumulate_in_at_least_float32():
  tree = {"a": jnp.full([70_000], 1.0, jnp.float16), "b": jnp.array([3.0, 4.0]), "empty": jnp.zeros([0])}
  assert float(guard.tree_sum(lambda x: jnp.sum(x, dtype=jnp.float32), tree)) == 70_007.0
  assert float(guard.tree_sq_norm({"b": tree["b"], "c": jnp.array([1j])})) == 26.0  # |1j|^2 = 1
  assert float(guard.tree_sq_norm({"a": jnp.full([70_000], 2.0, jnp.float16)})) == 280_000.0
  assert float(guard.tree_sq_norm({})) == 0.0
