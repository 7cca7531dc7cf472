"""The transformer language model: shapes, causality, a per-token loss and metrics, and a run that learns."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxsync
from jaxsync._src.app import config as config_lib
from jaxsync._src.app import experiment

TINY = dict(layers=1, width=32, heads=2)  # a short compile for the tests


def test_the_transformer_maps_int_tokens_to_next_token_logits():
  model = jaxsync.models.make("transformer", input_shape=(64,), num_classes=256)
  # Two blocks of width 64 (12 d^2 + 13 d each), tied embeddings 256 x 64, 64 positions, a final norm.
  assert model.num_params == 2 * (12 * 64 * 64 + 13 * 64) + 256 * 64 + 64 * 64 + 2 * 64 == 120_576
  assert model.input_key == "tokens" and model.input_dtype == jnp.int32 and model.input_shape == (64,)
  zeros = jaxsync.models.zeros_batch(model, 3)
  assert zeros.shape == (3, 64) and zeros.dtype == jnp.int32
  assert jax.jit(model.apply)(model.params, zeros).shape == (3, 64, 256)
  # One sequence of 64 tokens: at least the dense multiply-adds of every position.
  assert model.flops_per_sample > 2 * 64 * (2 * 12 * 64 * 64 + 256 * 64)
  untied = jaxsync.models.make("transformer", input_shape=(16,), num_classes=50, tied=False, **TINY)
  assert untied.num_params == 12 * 32 * 32 + 13 * 32 + 50 * 32 + 16 * 32 + 2 * 32 + 32 * 50 + 50
  assert untied.apply(untied.params, jnp.zeros((2, 10), jnp.int32)).shape == (2, 10, 50)  # shorter is fine
  with pytest.raises(ValueError, match=r"input_shape=\(8, 8, 1\) is invalid; expected \(sequence_length,\)"):
    jaxsync.models.make("transformer", input_shape=(8, 8, 1), num_classes=10)
  with pytest.raises(ValueError, match="width=30 is invalid; expected a multiple of heads=4"):
    jaxsync.models.make("transformer", input_shape=(8,), num_classes=10, width=30, heads=4)
  with pytest.raises(ValueError, match="inputs='audio' is invalid"):
    jaxsync.models.register("audio_example", inputs="audio")


def test_the_logits_at_a_position_do_not_see_later_tokens():
  model = jaxsync.models.make("transformer", input_shape=(16,), num_classes=20, seed=1, **TINY)
  apply = jax.jit(model.apply)
  tokens = jax.random.randint(jax.random.key(0), (2, 16), 0, 20)
  before = apply(model.params, tokens)
  for t in (0, 7, 14):
    changed = tokens.at[:, t + 1].set((tokens[:, t + 1] + 1) % 20)
    after = apply(model.params, changed)
    np.testing.assert_array_equal(after[:, : t + 1], before[:, : t + 1])  # positions <= t: unchanged
    assert not np.allclose(after[:, t + 1], before[:, t + 1])  # position t + 1 sees its own token


def test_loss_and_metrics_average_over_every_token():
  model = jaxsync.models.make("transformer", input_shape=(8,), num_classes=12, **TINY)
  rng = np.random.default_rng(0)
  tokens, labels = rng.integers(0, 12, (30, 8)), rng.integers(0, 12, (30, 8))
  logits = model.apply(model.params, jnp.asarray(tokens, jnp.int32))
  per_token = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  batch = {"tokens": tokens, "label": labels}
  assert float(jaxsync.models.classification_loss(model)(model.params, batch)) == pytest.approx(
    float(per_token.mean()), rel=1e-6
  )
  # 30 sequences in batches of 8: the last batch is padded with the first sequences and masked.
  metrics = jaxsync.models.classification_metrics(model, tokens, labels, batch_size=8)(model.params)
  assert float(metrics["loss"]) == pytest.approx(float(per_token.mean()), rel=1e-5)
  accuracy = float(jnp.mean(jnp.argmax(logits, -1) == labels))
  assert float(metrics["accuracy"]) == pytest.approx(accuracy, abs=1e-6)


def _corpus(tmp_path):
  """A small repetitive text, so that a few dozen updates of a tiny model learn it."""
  words = np.random.default_rng(0).choice(["the ", "file ", "hacker ", "jargon ", "of ", "a "], 3000)
  (tmp_path / "jargon.txt").write_text("".join(words))
  return str(tmp_path)


def test_a_config_trains_the_transformer_through_the_simulator_and_the_loss_falls(tmp_path):
  raw = {
    "data": {"name": "jargon", "data_dir": _corpus(tmp_path), "batch_size": 16, "sequence_length": 32},
    "model": {"name": "transformer", "options": TINY},
    "strategy": {"name": "allreduce", "options": {"learning_rate": 0.1, "momentum": 0.9}},
    "cluster": {"num_workers": 2, "compute_time": 0.01},
    "run": {"gradients": 120, "eval_every": 30, "chunk": 30},
  }
  exp = experiment.build(config_lib.from_dict(raw))
  assert exp.model.num_params == 12 * 32 * 32 + 13 * 32 + 256 * 32 + 32 * 32 + 2 * 32
  assert (
    exp.data.batch(0, 0)["tokens"].shape == (16, 32) and exp.data.batch(0, 0)["tokens"].dtype == jnp.int32
  )
  before = float(exp.eval_fn(exp.model.params)["loss"])
  assert before == pytest.approx(np.log(256), abs=0.1)  # uniform over the bytes at initialization
  params, history = exp.simulator().run(exp.model.params, num_events=exp.num_events)
  after = exp.eval_fn(params)
  assert history.updates == 60 and float(after["loss"]) < 2.5 < before - 3, (before, after)
  assert float(after["accuracy"]) > 0.3


def test_a_config_that_pairs_images_and_tokens_is_refused_naming_both(tmp_path):
  raw = {"data": {"name": "jargon", "data_dir": _corpus(tmp_path)}, "model": {"name": "cnn"}}
  with pytest.raises(config_lib.ConfigError, match="model.name='cnn' reads 'image' but data.name='jargon'"):
    experiment.build(config_lib.from_dict(raw))
  raw = {"data": {"name": "digits"}, "model": {"name": "transformer"}}
  with pytest.raises(config_lib.ConfigError, match="expected a model of 'image' .*cnn"):
    experiment.build(config_lib.from_dict(raw))
  raw = {"data": {"name": "digits"}, "model": {"name": "mlp", "hidden": [8], "options": {"hidden": [4]}}}
  with pytest.raises(config_lib.ConfigError, match="model.hidden and model.options.hidden are both set"):
    experiment.build(config_lib.from_dict(raw))
  raw = {"data": {"name": "jargon", "data_dir": _corpus(tmp_path)}, "model": {"name": "transformer"}}
  with pytest.raises(config_lib.ConfigError, match=r"model: models: unknown option\(s\) \['depth'\]"):
    experiment.build(config_lib.from_dict({**raw, "model": {"name": "transformer", "options": {"depth": 2}}}))


def test_a_model_of_ones_own_may_read_tokens(scratch_registries):
  from flax import nnx

  @jaxsync.models.register("bigram_example", inputs="tokens")
  def bigram(input_shape, num_classes, rngs):
    return nnx.Embed(num_classes, num_classes, rngs=rngs)  # logits of the next token from this one

  assert jaxsync.models.input_key("bigram_example") == "tokens"
  model = jaxsync.models.make("bigram_example", input_shape=(10,), num_classes=7)
  assert model.input_key == "tokens" and model.num_params == 49
  assert model.apply(model.params, jaxsync.models.zeros_batch(model, 2)).shape == (2, 10, 7)
  with pytest.raises(ValueError, match="name='bigram_example_typo' is invalid"):
    jaxsync.models.input_key("bigram_example_typo")
