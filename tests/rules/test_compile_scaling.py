"""Every rule's compiled update grows linearly with the number of parameter arrays (issue: real models).

A model without scanned layers has hundreds of arrays. A scalar that every
leaf's loop reads and that depends on all leaves (the finite check, a norm)
was copied into each loop: the compiled program grew with the square of the
number of arrays, and at 300 arrays an OrMo update compiled in two minutes.
Counting the instructions of the optimized program at 6 and 24 arrays
measures that without timing anything: linear growth is at most 4x.
The timings themselves are in ``benchmarks/speed/compile_time.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
import pytest

from rule_cases import CASES, extra_args_for

SHAPES = ((16, 48), (16, 16), (16, 64), (64, 16), (16,), (16,))  # a transformer block's, small


def _params(num_arrays):
  return {f"w{i:04d}": jnp.full(SHAPES[i % len(SHAPES)], 0.01) for i in range(num_arrays)}


def _compiled_instructions(tx, extra_args, num_arrays):
  params = _params(num_arrays)
  state = tx.init(params)
  compiled = (
    jax.jit(lambda g, s, p: tx.update(g, s, p, **extra_args(s, p))).lower(params, state, params).compile()
  )
  return sum(1 for line in compiled.as_text().splitlines() if " = " in line)


def test_the_control_optax_sgd_grows_linearly():
  small, large = (_compiled_instructions(optax.sgd(0.1, momentum=0.9), lambda s, p: {}, n) for n in (6, 24))
  assert large <= 4.0 * small


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_compiled_update_grows_linearly_with_the_number_of_arrays(case):
  def extra(state, params):
    return extra_args_for(case, state, params)

  small, large = (_compiled_instructions(case.make(), extra, n) for n in (6, 24))
  # 4x the arrays: linear growth plus the rule's constant part stays under 4x; the quadratic copy measured 5.6-8.3x.
  assert large <= 4.0 * small, (small, large)
