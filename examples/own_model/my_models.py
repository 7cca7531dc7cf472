"""Two models of one's own, as a user writes them, trained by jaxsync through the command line.

* ``BatchNormCnn``: a flax nnx CNN with BatchNorm and dropout, an nnx builder
  (``__init__(input_shape, num_classes, rngs)``): ``model.name: my_models:BatchNormCnn``.
* ``Decoder``: a flax Linen byte-level decoder (a causal transformer) with
  dropout, a Linen module class (``num_classes`` is its vocabulary):
  ``model.name: my_models:Decoder``.

Neither knows about jaxsync: the BatchNorm's running statistics, the dropout
streams and the evaluation mode are found by jaxsync (nnx ``train()`` and
``eval()``; Linen's ``train`` argument).
"""

import flax.linen as nn
import jax.numpy as jnp
from flax import nnx

import jaxsync


class BatchNormCnn(nnx.Module):
  """3x3 convolution, BatchNorm, ReLU, 2x2 max pooling, dropout, a dense layer.

  The convolution is ``jaxsync.models.ShiftConv``, ``nnx.Conv``'s parameters and outputs computed as
  shifted views and a matrix product: ``nnx.Conv`` works as well, but XLA's CPU convolution runs tens
  of times slower inside the simulator's compiled loop.
  """

  def __init__(self, input_shape, num_classes, rngs, *, width=32, dropout=0.2):
    height, width_px, channels = input_shape
    self.conv = jaxsync.models.ShiftConv(channels, width, (3, 3), rngs=rngs)
    self.norm = nnx.BatchNorm(width, momentum=0.9, rngs=rngs)
    self.drop = nnx.Dropout(dropout, rngs=rngs)
    self.head = nnx.Linear((height // 2) * (width_px // 2) * width, num_classes, rngs=rngs)

  def __call__(self, x):
    x = nnx.relu(self.norm(self.conv(x)))
    x = nnx.max_pool(x, (2, 2), strides=(2, 2))
    x = self.drop(x)
    return self.head(x.reshape(x.shape[0], -1))


class _Block(nn.Module):
  width: int
  heads: int
  dropout: float

  @nn.compact
  def __call__(self, x, train: bool):
    mask = nn.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))
    y = nn.MultiHeadDotProductAttention(
      num_heads=self.heads, dropout_rate=self.dropout, deterministic=not train
    )(nn.LayerNorm()(x), mask=mask)
    x = x + nn.Dropout(self.dropout, deterministic=not train)(y)
    y = nn.Dense(4 * self.width)(nn.LayerNorm()(x))
    y = nn.Dense(self.width)(nn.gelu(y))
    return x + nn.Dropout(self.dropout, deterministic=not train)(y)


class Decoder(nn.Module):
  """A byte-level causal transformer decoder: tokens [batch, T] -> next-token logits [batch, T, num_classes]."""

  num_classes: int = 256
  length: int = 64
  layers: int = 2
  width: int = 64
  heads: int = 2
  dropout: float = 0.1

  @nn.compact
  def __call__(self, tokens, train: bool = False):
    x = nn.Embed(self.num_classes, self.width)(tokens)
    x = x + self.param("position", nn.initializers.normal(0.02), (self.length, self.width))[: tokens.shape[1]]
    for _ in range(self.layers):
      x = _Block(self.width, self.heads, self.dropout)(x, train)
    return nn.Dense(self.num_classes)(nn.LayerNorm()(x))
