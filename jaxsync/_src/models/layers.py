"""The layers jaxsync's networks are built of, where flax's own do not fit a simulated worker.

:class:`BatchStatNorm` normalizes with the batch's own statistics (a simulated
worker's model must be a pure function of its parameters); :class:`ShiftConv`
computes a convolution as shifted views and one matrix product (XLA's CPU
convolution runs far slower inside the simulator's compiled loop).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


class BatchStatNorm(nnx.Module):
  """Batch normalization with the batch's own statistics, in training and evaluation.

  ``y = (x - mean_B(x)) / sqrt(var_B(x) + eps) * scale + bias`` over every axis
  but the channels. Running averages are not kept: a simulated worker's model
  is a pure function of its parameters (no mutable state to carry per worker
  and per version), so evaluation also normalizes with batch statistics, over
  large evaluation batches.
  """

  def __init__(self, features: int, *, epsilon: float = 1e-5):
    self.scale = nnx.Param(jnp.ones([features]))
    self.bias = nnx.Param(jnp.zeros([features]))
    self.epsilon = epsilon

  def __call__(self, x):
    axes = tuple(range(x.ndim - 1))
    mean = jnp.mean(x, axis=axes)
    var = jnp.var(x, axis=axes)
    return (x - mean) * jax.lax.rsqrt(var + self.epsilon) * self.scale[...] + self.bias[...]


class ShiftConv(nnx.Module):
  r"""A ``k x k`` convolution with "SAME" padding, computed as ``k*k`` shifted views and one matmul.

  ``y[n, p] = sum_{i,j} x_pad[n, s p + (i, j)] @ W[i, j] + b`` (the
  cross-correlation of ``lax.conv_general_dilated``, identical outputs and
  parameters to ``nnx.Conv``). ``depthwise=True`` is the per-channel variant
  (``nnx.Conv(..., feature_group_count=in_features)``).

  Why not ``nnx.Conv``: inside a ``while_loop`` (the simulator's compiled
  event loop) XLA's CPU convolution runs about 25x slower than the same
  convolution outside a loop (3x3, 32 to 64 channels, 8x8: 40 ms against
  1.6 ms per gradient on 2 cores), while slices and a matrix product run at
  full speed in both places (0.7 ms).

  Use it in a model of your own in place of ``nnx.Conv`` (the same arguments
  for the cases it covers: square strides, "SAME" padding, optional bias and
  depthwise) when the model trains in the simulator on a CPU.

  Example:
    >>> import jax.numpy as jnp, jaxsync
    >>> from flax import nnx
    >>> conv = jaxsync.models.ShiftConv(1, 8, (3, 3), rngs=nnx.Rngs(0))
    >>> conv(jnp.zeros((2, 8, 8, 1))).shape
    (2, 8, 8, 8)
  """

  def __init__(
    self,
    in_features: int,
    out_features: int,
    kernel_size: tuple[int, int],
    *,
    strides: int = 1,
    depthwise: bool = False,
    use_bias: bool = True,
    rngs: nnx.Rngs,
  ):
    kh, kw = kernel_size
    shape = (kh, kw, 1 if depthwise else in_features, out_features)
    self.kernel = nnx.Param(nnx.initializers.lecun_normal()(rngs.params(), shape))
    if use_bias:
      self.bias = nnx.Param(jnp.zeros([out_features]))
    self.use_bias = use_bias
    self.strides = strides
    self.depthwise = depthwise

  def __call__(self, x):
    kernel = self.kernel[...]
    kh, kw, _, out_features = kernel.shape
    _, height, width, channels = x.shape
    s = self.strides
    out_h, out_w = -(-height // s), -(-width // s)
    pad_h = max((out_h - 1) * s + kh - height, 0)
    pad_w = max((out_w - 1) * s + kw - width, 0)
    xp = jnp.pad(x, ((0, 0), (pad_h // 2, pad_h - pad_h // 2), (pad_w // 2, pad_w - pad_w // 2), (0, 0)))
    views = [
      xp[:, i : i + (out_h - 1) * s + 1 : s, j : j + (out_w - 1) * s + 1 : s, :]
      for i in range(kh)
      for j in range(kw)
    ]
    if self.depthwise:
      y = sum(v * kernel[i // kw, i % kw, 0] for i, v in enumerate(views))
    else:
      patches = views[0] if len(views) == 1 else jnp.concatenate(views, axis=-1)
      y = patches @ kernel.reshape(kh * kw * channels, out_features)
    return y + self.bias[...] if self.use_bias else y
