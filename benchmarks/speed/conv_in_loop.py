"""Why jaxsync's models compute convolutions as shifted views and a matmul (``ShiftConv``).

One gradient of a 3x3 convolution layer (NHWC, SAME padding) costs, on XLA's
CPU backend, far more inside a compiled loop (``fori_loop``: what the
simulator's ``while_loop`` runs) than as a plain jitted call. This measures,
side by side in one run and interleaved round by round, four variants:
``lax.conv_general_dilated`` and ``ShiftConv`` (the same outputs and
parameters), each as a plain jitted gradient call and inside a loop of
``--steps`` gradient steps. Ratios are paired per round against ``lax.conv``
outside a loop.

Run: ``python -m benchmarks.speed.conv_in_loop [--rounds 7] [--steps 50] [--batch 32] [--size 8]``.
This is a benchmark, not a test: it prints what it measured and asserts nothing.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxsync._src.models.layers import ShiftConv


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--steps", type=int, default=50)
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--size", type=int, default=8, help="image height and width")
  parser.add_argument("--channels", type=int, nargs=2, default=(32, 64), metavar=("IN", "OUT"))
  args = parser.parse_args()

  c_in, c_out = args.channels
  x = jax.random.normal(jax.random.key(0), (args.batch, args.size, args.size, c_in))
  graphdef, state = nnx.split(ShiftConv(c_in, c_out, (3, 3), use_bias=False, rngs=nnx.Rngs(0)))
  kernel = nnx.to_pure_dict(state)["kernel"]

  def lax_conv(w, x):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

  def shift_conv(w, x):
    return nnx.merge(graphdef, {"kernel": w})(x)

  gap = float(jnp.max(jnp.abs(lax_conv(kernel, x) - jax.jit(shift_conv)(kernel, x))))

  def variants():
    out = {}
    for name, conv in (("lax.conv", lax_conv), ("ShiftConv", shift_conv)):
      loss = lambda w, x, conv=conv: jnp.sum(jnp.tanh(conv(w, x)))
      grad = jax.jit(jax.grad(loss))

      def plain(w, grad=grad):
        for _ in range(args.steps):
          w = w - 1e-4 * grad(w, x)
        return w

      looped = jax.jit(
        lambda w, loss=loss: jax.lax.fori_loop(0, args.steps, lambda i, w: w - 1e-4 * jax.grad(loss)(w, x), w)
      )
      out[f"{name}, plain jit call"] = plain
      out[f"{name}, inside a fori_loop"] = looped
    return out

  runs = variants()
  for fn in runs.values():  # compile and warm up
    jax.block_until_ready(fn(kernel))
  samples = {name: [] for name in runs}
  for _ in range(args.rounds):
    for name, fn in runs.items():
      start = time.perf_counter()
      jax.block_until_ready(fn(kernel))
      samples[name].append((time.perf_counter() - start) / args.steps * 1e3)

  base = samples["lax.conv, plain jit call"]
  print(
    f"3x3 conv {c_in}->{c_out} channels, {args.size}x{args.size}, batch {args.batch}; "
    f"{args.rounds} interleaved rounds of {args.steps} gradient steps; max |lax.conv - ShiftConv| = {gap:.1e}"
  )
  print(
    f"machine: {platform.machine()}, {jax.device_count()} {jax.default_backend()} device(s), jax {jax.__version__}"
  )
  print()
  print("| variant | ms per gradient, median | ratio to lax.conv plain, median (paired) |")
  print("|---|---:|---:|")
  for name, times in samples.items():
    ratios = [t / b for t, b in zip(times, base)]
    print(f"| {name} | {statistics.median(times):.3f} | {float(np.median(ratios)):.2f} |")


if __name__ == "__main__":
  main()
