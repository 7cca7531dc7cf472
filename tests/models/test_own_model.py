"""A user's own model, end to end: by import path, its state beside the parameters, given back.

The models are those of ``examples/own_model/my_models.py``: an nnx CNN with
BatchNorm and dropout, and a Linen decoder with dropout; the small ones below
are written here as a user would.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxsync
from jaxsync._src.app import config as config_lib
from jaxsync._src.app import experiment
from jaxsync._src.core import variables
from jaxsync._src.rules.model_state import keep_model_state

from helpers import ROOT

EXAMPLE = ROOT / "examples" / "own_model"
_MODULES = 0


@pytest.fixture
def own_module(tmp_path, monkeypatch):
  """Writes a module of the user's into a fresh folder, makes it the current directory, returns its name."""

  def write(source: str) -> str:
    global _MODULES
    _MODULES += 1
    name = f"user_models_{_MODULES}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.chdir(tmp_path)
    return name

  return write


@pytest.fixture
def example(monkeypatch):
  monkeypatch.chdir(EXAMPLE)
  monkeypatch.syspath_prepend(str(EXAMPLE))


def _config(model: str, strategy_name: str = "asp", **sections) -> config_lib.Config:
  raw = {
    "name": "own",
    "model": {"name": model},
    "strategy": {"name": strategy_name, "options": {"learning_rate": 0.05}},
    "cluster": {"num_workers": 4},
    "run": {"gradients": 1600, "eval_every": 20},
  }
  for key, value in sections.items():
    raw[key] = {**raw.get(key, {}), **value}
  return config_lib.from_dict(raw)


# -- import paths and bad input --------------------------------------------------------------------


def test_a_config_names_a_model_by_import_path_and_it_is_built(example):
  exp = experiment.build(_config("my_models:BatchNormCnn"))
  assert exp.model.kind == "nnx" and exp.model.has_state and exp.model.uses_rng
  # 3x3x1x32 + 32 (conv) + 32 + 32 (BatchNorm's scale and bias) + 4x4x32x10 + 10: the running mean and
  # variance (2 x 32) are not parameters.
  assert exp.model.num_params == 9 * 32 + 32 + 64 + 4 * 4 * 32 * 10 + 10
  state = variables.model_state_of(exp.model.params)
  assert sorted(state["norm"]) == ["mean", "var"]


@pytest.mark.parametrize(
  "source, name, message",
  [
    ("", "no_such_module_here:Model", "no module named 'no_such_module_here' in the current directory"),
    ("raise RuntimeError('broken on purpose')", None, "raised RuntimeError: broken on purpose"),
    ("x = 1", None, "has no attribute 'Model'; it has x"),
    (
      "def Model(input_shape, num_classes, rngs):\n  return 42",
      None,
      "returned a int; expected an nnx.Module",
    ),
    ("import no_such_dependency_here", None, "importing 'user_models_"),  # the module's own import failed
    ("class Model:\n  pass", "{module}:Model.build", "has no attribute 'build'; it has no public names"),
    (
      "def Model(input_shape, num_classes, rngs):\n  raise RuntimeError('bad width')",
      None,
      "RuntimeError: bad width",
    ),
  ],
  ids=[
    "missing module",
    "raises on import",
    "missing attribute",
    "returns no module",
    "missing dependency",
    "missing inner attribute",
    "builder raises",
  ],
)
def test_a_bad_import_path_fails_in_one_line_at_the_config(own_module, source, name, message):
  module = own_module(source)
  name = (name or "{module}:Model").format(module=module)
  with pytest.raises((config_lib.ConfigError, ValueError)) as err:
    experiment.build(_config(name))
  text = str(err.value)
  assert message in text and "\n" not in text, text


def test_a_model_with_one_output_for_ten_classes_is_refused_before_training(own_module):
  module = own_module(
    """
    from flax import nnx
    def Model(input_shape, num_classes, rngs):
      return nnx.Sequential(lambda x: x.reshape(x.shape[0], -1), nnx.Linear(64, 1, rngs=rngs))
    """
  )
  with pytest.raises(config_lib.ConfigError, match=r"returns outputs of shape \(2, 1\).*expected \(2, 10\)"):
    experiment.build(_config(f"{module}:Model"))


def test_integer_model_state_is_refused_saying_what_is_supported(own_module):
  module = own_module(
    """
    import jax.numpy as jnp
    from flax import nnx
    class Counter(nnx.Variable):
      pass
    class Model(nnx.Module):
      def __init__(self, input_shape, num_classes, rngs):
        self.head = nnx.Linear(64, num_classes, rngs=rngs)
        self.seen = Counter(jnp.zeros([], jnp.int32))
      def __call__(self, x):
        return self.head(x.reshape(x.shape[0], -1))
    """
  )
  with pytest.raises(
    config_lib.ConfigError, match=r"\['seen'\] of dtype int32.*expected floating-point state"
  ):
    experiment.build(_config(f"{module}:Model"))


def test_a_dataset_by_import_path_without_the_label_key_is_refused_by_name(own_module):
  module = own_module(
    """
    import numpy as np
    import jaxsync
    def load(seed):
      x = np.zeros((40, 8, 8, 1), np.float32)
      split = {"x": x, "y": np.zeros(40, np.int32)}
      return jaxsync.datasets.Dataset("mine", split, split, 10)
    def outside(seed):
      x = np.zeros((40, 8, 8, 1), np.float32)
      split = {"image": x, "label": np.arange(40, dtype=np.int32)}
      return jaxsync.datasets.Dataset("mine", split, split, 10)
    """
  )
  with pytest.raises(config_lib.ConfigError, match=r"keys \['x', 'y'\], without \['image', 'label'\]"):
    experiment.build(_config("cnn", data={"name": f"{module}:load"}))
  with pytest.raises(config_lib.ConfigError, match=r"spans 0..39, outside the model's outputs 0..9"):
    experiment.build(_config("cnn", data={"name": f"{module}:outside"}))


# -- the state beside the parameters ---------------------------------------------------------------


def test_the_rules_never_touch_the_state_and_each_arrival_sets_it():
  tx = keep_model_state(optax.chain(optax.add_decayed_weights(0.5), optax.sgd(0.1, momentum=0.9)))
  model = {"params": jnp.ones(2), "model_state": {"var": jnp.ones(2)}}
  state = tx.init(model)
  new_var = jnp.array([0.8, 1.3])
  grads = {"params": jnp.zeros(2), "model_state": {"var": model["model_state"]["var"] - new_var}}
  updates, state = tx.update(grads, state, model)
  moved = optax.apply_updates(model, updates)
  np.testing.assert_allclose(moved["model_state"]["var"], new_var, rtol=1e-6)  # not 0.905: no decay
  np.testing.assert_allclose(moved["params"], 1 - 0.1 * 0.5)  # the decay reaches the parameters
  bad = {"params": jnp.zeros(2), "model_state": {"var": jnp.array([jnp.nan, 0.0])}}
  updates, _ = tx.update(bad, state, moved)
  assert float(jnp.abs(updates["model_state"]["var"]).sum()) == 0.0  # a rejected arrival changes nothing


def test_a_server_moves_the_state_by_a_share_of_each_arrival_and_a_buffering_rule_by_the_mean():
  from jaxsync._src.rules import contracts

  model = {"params": jnp.zeros(2), "model_state": {"var": jnp.ones(2)}}
  change = {"params": jnp.ones(2), "model_state": {"var": jnp.array([0.4, -0.4])}}
  share = keep_model_state(optax.sgd(0.1), "share")
  updates, _ = share.update(change, share.init(model), model, num_live_workers=4)
  np.testing.assert_allclose(updates["model_state"]["var"], [-0.1, 0.1])  # a quarter: one of 4 arrivals
  message = keep_model_state(optax.sgd(0.1), "message")  # a worker's message: the change itself
  updates, _ = message.update(change, message.init(model), model)
  np.testing.assert_allclose(updates["model_state"]["var"], [0.4, -0.4])
  buffered = keep_model_state(jaxsync.adaptive_k(momentum=0.0, max_k=2), "share")
  state, seen = buffered.init(model), []
  for c in ([0.2, 0.2], [0.4, 0.0]):
    g = {"params": jnp.ones(2), "model_state": {"var": jnp.array(c)}}
    updates, state = buffered.update(
      g, state, model, version=contracts.server_version(state), num_live_workers=4
    )
    seen.append((bool(contracts.released(state)), np.asarray(updates["model_state"]["var"])))
  assert not seen[0][0] and not seen[0][1].any()  # held until the release
  assert seen[1][0]
  np.testing.assert_allclose(seen[1][1], [-0.3, -0.1])  # the mean of the two changes it released


def test_a_strategy_without_with_model_state_is_refused_at_init(example):
  exp = experiment.build(_config("my_models:BatchNormCnn"))
  plain = jaxsync.strategies.make("asp", 4, learning_rate=0.05)
  with pytest.raises(ValueError, match="with_model_state"):
    jaxsync.sim.Simulator(plain, exp.loss_fn, exp.data, exp.time_model).init(exp.model.params)


def test_an_elastic_strategy_without_with_model_state_is_refused_for_its_worker_rule(example):
  exp = experiment.build(_config("my_models:BatchNormCnn", "easgd"))
  plain = jaxsync.strategies.make("easgd", 4, learning_rate=0.05)
  with pytest.raises(ValueError, match="worker rule do not keep it apart"):
    jaxsync.sim.Simulator(plain, exp.loss_fn, exp.data, exp.time_model).init(exp.model.params)


def test_the_loss_of_a_model_with_state_carries_its_change_in_the_gradient_only(example):
  exp = experiment.build(_config("my_models:BatchNormCnn"))
  batch = exp.data.batch(0, 0)
  loss, grads = jax.value_and_grad(exp.loss_fn)(exp.model.params, batch)
  logits, new_state = exp.model.train_apply(exp.model.params, batch["image"], batch["_rng"][0])
  plain = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
  assert float(loss) == pytest.approx(float(plain), rel=1e-6)
  state = variables.model_state_of(exp.model.params)
  for g, s, n in zip(*(jax.tree.leaves(t) for t in (grads["model_state"], state, new_state))):
    np.testing.assert_allclose(g, s - n, atol=1e-7)


def test_dropout_differs_per_worker_and_is_the_same_for_the_same_seed(example):
  exp = experiment.build(_config("my_models:BatchNormCnn"))
  again = experiment.build(_config("my_models:BatchNormCnn"))
  b0, b1 = exp.data.batch(0, 3), exp.data.batch(1, 3)
  assert int(b0["_rng"][0]) != int(b1["_rng"][0])
  assert int(b0["_rng"][0]) == int(again.data.batch(0, 3)["_rng"][0])
  x = b0["image"]
  out_a, _ = exp.model.train_apply(exp.model.params, x, b0["_rng"][0])
  out_b, _ = exp.model.train_apply(exp.model.params, x, b1["_rng"][0])
  out_c, _ = again.model.train_apply(again.model.params, x, b0["_rng"][0])
  assert not np.allclose(out_a, out_b)  # another worker's dropout mask
  np.testing.assert_array_equal(out_a, out_c)


@pytest.mark.parametrize(
  "strategy",
  [
    pytest.param("asp", marks=pytest.mark.heavy),
    pytest.param("diloco", marks=pytest.mark.heavy),
    pytest.param("allreduce", marks=pytest.mark.heavy),
    pytest.param("easgd", marks=pytest.mark.heavy),
  ],
)
def test_training_updates_the_running_statistics_towards_the_batch_statistics(example, strategy):
  options = {"learning_rate": 0.002 if strategy == "diloco" else 0.05}
  if strategy == "diloco":
    options["period"] = 10
  config = _config("my_models:BatchNormCnn", strategy, strategy={"options": options}, run={"gradients": 800})
  exp = experiment.build(config)
  params, _ = jaxsync.sim.run(
    exp.strategy, exp.loss_fn, exp.model.params, exp.data, exp.time_model, num_gradients=800
  )
  module = exp.model.export(params)
  digits = exp.dataset.train["image"][:512]
  batch_mean = np.asarray(module.conv(jnp.asarray(digits)).mean(axis=(0, 1, 2)))
  start = np.zeros_like(batch_mean)  # nnx.BatchNorm's initial mean
  running = np.asarray(module.norm.mean[...])
  # The running mean left its start and lies near the mean of its input over the data.
  assert np.abs(running - start).mean() > 0.5 * np.abs(batch_mean - start).mean()
  assert np.abs(running - batch_mean).mean() < 0.25 * np.abs(batch_mean - start).mean() + 0.02


@pytest.mark.heavy  # 2,400 gradients of DiLoCo: 25 s
def test_diloco_with_batchnorm_evaluates_within_a_point_of_batch_statistics(example, tmp_path):
  config = _config(
    "my_models:BatchNormCnn",
    "diloco",
    strategy={"options": {"learning_rate": 0.002, "period": 10}},
    run={"gradients": 2400, "eval_every": 6},
  )
  result = jaxsync.train_config(config_lib.to_dict(config), out=tmp_path / "diloco")
  exp = experiment.build(config)
  module = exp.model.export(result.params)
  x, y = jnp.asarray(exp.dataset.test["image"]), exp.dataset.test["label"]
  eval_mode = float((jnp.argmax(module(x), -1) == y).mean())
  module.train()  # batch statistics of the whole test set, dropout off for the comparison
  module.drop.deterministic = True
  train_mode = float((jnp.argmax(module(x), -1) == y).mean())
  assert eval_mode == pytest.approx(result.summary["final_accuracy"], abs=1e-6)
  assert abs(eval_mode - train_mode) <= 0.01, (eval_mode, train_mode)


# -- through the command line, and given back ------------------------------------------------------


def _cli(*args, cwd):
  return subprocess.run(
    [sys.executable, "-m", "jaxsync.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=600
  )


@pytest.mark.heavy  # a whole jaxsync train process: 22 s
def test_the_example_cnn_trains_through_jaxsync_train_and_load_model_gives_it_back(tmp_path):
  out = tmp_path / "cnn"
  done = _cli("train", str(EXAMPLE / "cnn.yaml"), "--out", str(out), "--progress", "jsonl", cwd=EXAMPLE)
  assert done.returncode == 0, done.stderr[-3000:]
  summary = json.loads((out / "summary.json").read_text())
  assert summary["final_accuracy"] >= 0.95, summary
  sys.path.insert(0, str(EXAMPLE))
  try:
    module = jaxsync.load_model(out)
  finally:
    sys.path.remove(str(EXAMPLE))
  assert isinstance(module, nnx.Module) and type(module).__name__ == "BatchNormCnn"
  digits = jaxsync.datasets.load("digits")
  own = float((jnp.argmax(module(jnp.asarray(digits.test["image"])), -1) == digits.test["label"]).mean())
  assert own == pytest.approx(summary["final_accuracy"], abs=1e-6)


def test_load_model_of_an_unfinished_run_says_how_to_finish_it(tmp_path):
  (tmp_path / "config.yaml").write_text("name: x\n")
  with pytest.raises(ValueError, match=r"has not finished.*jaxsync resume"):
    jaxsync.load_model(tmp_path)


@pytest.mark.heavy  # a parameter server and two worker threads: 6 s
def test_the_own_loop_example_trains_on_a_real_parameter_server(example):
  import own_loop

  module, history, final = own_loop.train(num_workers=2, num_events=400)
  assert history.updates == 400
  assert final["accuracy"] >= 0.9, final
  digits = jaxsync.datasets.load("digits")
  own = float((jnp.argmax(module(jnp.asarray(digits.test["image"])), -1) == digits.test["label"]).mean())
  assert own == pytest.approx(final["accuracy"], abs=1e-6)


_BN_MLP = """
from flax import nnx

class Model(nnx.Module):
  def __init__(self, input_shape, num_classes, rngs):
    self.dense = nnx.Linear(64, 32, rngs=rngs)
    self.norm = nnx.BatchNorm(32, rngs=rngs)
    self.drop = nnx.Dropout(0.1, rngs=rngs)
    self.head = nnx.Linear(32, num_classes, rngs=rngs)

  def __call__(self, x):
    x = self.drop(nnx.relu(self.norm(self.dense(x.reshape(x.shape[0], -1)))))
    return self.head(x)
"""


@pytest.mark.heavy  # every strategy of the registry compiled once: about a minute
@pytest.mark.parametrize("name", jaxsync.strategies.names())
def test_every_strategy_trains_a_model_with_state_and_moves_its_statistics(own_module, name):
  module = own_module(_BN_MLP)
  info = jaxsync.strategies.describe(name)
  options = {"learning_rate": 0.01} if "learning_rate" in info.options else {}
  config = _config(f"{module}:Model", name, strategy={"options": options}, run={"gradients": 256})
  exp = experiment.build(config)
  params, history = jaxsync.sim.run(
    exp.strategy, exp.loss_fn, exp.model.params, exp.data, exp.time_model, num_gradients=256
  )
  mean = np.asarray(variables.model_state_of(params)["norm"]["mean"])
  assert np.isfinite(mean).all() and np.abs(mean).sum() > 0, name  # the statistics moved off their zeros
  assert history.rejected_count == 0, name
  metrics = exp.simulator().evaluate(params)
  assert np.isfinite(metrics["loss"]), name


def test_tokens_outside_the_vocabulary_are_refused_by_name(own_module):
  module = own_module(
    """
    import numpy as np
    import jaxsync
    def load(seed):
      tokens = np.full((40, 8), 300, np.int32)
      split = {"tokens": tokens, "label": np.zeros((40, 8), np.int32)}
      return jaxsync.datasets.Dataset("bytes", split, split, 256, input_key="tokens")
    """
  )
  with pytest.raises(
    config_lib.ConfigError, match=r"\['tokens'\] spans 300..300; expected token ids in \[0, "
  ):
    experiment.build(_config("transformer", data={"name": f"{module}:load"}))
