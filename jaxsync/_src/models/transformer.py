"""A small decoder-only transformer language model in flax (nnx): tokens ``[B, T]`` to logits ``[B, T, V]``.

GPT-style (Radford et al. 2019): token and learned position embeddings,
pre-LayerNorm blocks of causal multi-head self-attention and a GELU MLP, a
final LayerNorm, and an output layer tied to the token embedding (or its own).
Written with plain ``nnx.Linear`` and ``einsum`` (no dropout, no cache): a
simulated worker's model is a pure function of its parameters.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

_EMBED_INIT = nnx.initializers.normal(0.02)


class CausalSelfAttention(nnx.Module):
  r"""Multi-head self-attention in which position ``t`` attends to positions ``<= t`` only.

  ``softmax(Q K^T / sqrt(d_head) + M) V`` per head, ``M`` being ``-inf``
  above the diagonal (Vaswani et al. 2017, §3.2, with the decoder's mask).

  Args:
    width: the model width ``d``, a multiple of ``heads``.
    heads: the number of heads.
    rngs: the initialization keys.
  """

  def __init__(self, width: int, heads: int, *, rngs: nnx.Rngs):
    self.heads = heads
    self.qkv = nnx.Linear(width, 3 * width, rngs=rngs)
    self.out = nnx.Linear(width, width, rngs=rngs)

  def __call__(self, x):
    batch, length, width = x.shape
    head = width // self.heads
    q, k, v = jnp.split(self.qkv(x).reshape(batch, length, 3 * self.heads, head), 3, axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head)
    causal = jnp.tril(jnp.ones((length, length), bool))
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    weights = jax.nn.softmax(scores, axis=-1)
    y = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(batch, length, width)
    return self.out(y)


class Block(nnx.Module):
  """A pre-LayerNorm transformer block: ``x + attention(norm(x))``, then ``x + mlp(norm(x))``."""

  def __init__(self, width: int, heads: int, mlp_ratio: int, *, rngs: nnx.Rngs):
    self.norm0 = nnx.LayerNorm(width, rngs=rngs)
    self.attention = CausalSelfAttention(width, heads, rngs=rngs)
    self.norm1 = nnx.LayerNorm(width, rngs=rngs)
    self.up = nnx.Linear(width, mlp_ratio * width, rngs=rngs)
    self.down = nnx.Linear(mlp_ratio * width, width, rngs=rngs)

  def __call__(self, x):
    x = x + self.attention(self.norm0(x))
    return x + self.down(nnx.gelu(self.up(self.norm1(x))))


class Transformer(nnx.Module):
  """A decoder-only transformer language model: int tokens ``[B, T]`` to next-token logits ``[B, T, V]``.

  The logits at position ``t`` depend on tokens ``0..t`` only (causal
  attention), so one forward pass gives a prediction at every position.

  Args:
    vocab_size: ``V``, the number of token ids.
    max_length: the longest sequence (the number of learned positions);
      shorter sequences use the first positions.
    layers: the number of blocks.
    width: the model width ``d``, a multiple of ``heads``.
    heads: attention heads per block.
    mlp_ratio: the MLP's hidden width, in multiples of ``d``.
    tied: whether the output layer is the token embedding's transpose (no
      parameters of its own; Press & Wolf 2017) or a separate dense layer.
    rngs: the initialization keys.

  Example:
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from jaxsync._src.models.transformer import Transformer
    >>> model = Transformer(256, 64, layers=1, width=32, heads=2, mlp_ratio=4, tied=True, rngs=nnx.Rngs(0))
    >>> model(jnp.zeros((2, 16), jnp.int32)).shape
    (2, 16, 256)

  References:
    Vaswani et al., "Attention Is All You Need", NeurIPS 2017; Radford et al.,
    "Language Models are Unsupervised Multitask Learners" (GPT-2, pre-LayerNorm
    blocks), 2019; Press & Wolf, "Using the Output Embedding to Improve
    Language Models", EACL 2017 (tied embeddings).
  """

  def __init__(
    self,
    vocab_size: int,
    max_length: int,
    *,
    layers: int,
    width: int,
    heads: int,
    mlp_ratio: int,
    tied: bool,
    rngs: nnx.Rngs,
  ):
    self.embed = nnx.Embed(vocab_size, width, embedding_init=_EMBED_INIT, rngs=rngs)
    self.position = nnx.Param(_EMBED_INIT(rngs.params(), (max_length, width)))
    self.num_layers = layers
    for i in range(layers):
      setattr(self, f"block{i}", Block(width, heads, mlp_ratio, rngs=rngs))
    self.norm = nnx.LayerNorm(width, rngs=rngs)
    self.tied = tied
    if not tied:
      self.head = nnx.Linear(width, vocab_size, rngs=rngs)

  def __call__(self, tokens):
    length = tokens.shape[1]
    x = self.embed(tokens) + self.position[...][:length]
    for i in range(self.num_layers):
      x = getattr(self, f"block{i}")(x)
    x = self.norm(x)
    return self.embed.attend(x) if self.tied else self.head(x)
