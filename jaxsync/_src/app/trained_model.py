"""The trained model of a run directory, given back as the user's own model."""

from __future__ import annotations

import pathlib
from typing import Any

from jaxsync._src.app import config as config_lib
from jaxsync._src.app import experiment
from jaxsync._src.train import checkpoints


def load_model(run_dir: str | pathlib.Path) -> Any:
  """The model a finished run trained, as your own: an nnx module, or Linen variables.

  Rebuilds the run's model from its recorded ``config.yaml`` (a
  ``module:attribute`` model is imported again, as Python finds it) and sets
  the final parameters and state (BatchNorm's running statistics) that the run
  wrote to ``model.npz`` when it ended, so you evaluate it with your own code:

  * an nnx model comes back as the ``nnx.Module`` your builder returns, in
    ``eval()`` mode (call ``.train()`` on it to train on);
  * a Linen model comes back as its variables, ``{"params": ..., "batch_stats":
    ...}``, for ``module.apply(variables, x, train=False)``.

  Args:
    run_dir: a run directory of ``jaxsync train``, ``launch`` or ``resume``.

  Returns:
    The nnx module, or the Linen variables.

  Raises:
    ValueError: not a run directory, or a run that has not finished (``jaxsync
      resume`` finishes it), or a model file that does not fit the config's model.

  Example:
    >>> import tempfile, jaxsync
    >>> config = {"model": {"name": "mlp", "hidden": [16]}, "strategy": {"name": "asp"},
    ...           "run": {"gradients": 16, "eval_every": 16}, "cluster": {"num_workers": 1}}
    >>> result = jaxsync.train_config(config, out=tempfile.mkdtemp(), overwrite=True)
    >>> model = jaxsync.load_model(result.run_dir)  # an nnx module, in eval() mode
    >>> type(model).__name__, model(jaxsync.datasets.load("digits").test["image"][:3]).shape
    ('Mlp', (3, 10))
  """
  run_dir = pathlib.Path(run_dir)
  path = run_dir / "config.yaml"
  if not path.is_file():
    raise ValueError(
      f"load_model: {str(run_dir)!r} is not a jaxsync run directory: {str(path)!r} is missing."
    )
  config = config_lib.load(path)
  model = experiment.build_model(config, experiment.build_dataset(config))
  carried = checkpoints.restore_model(run_dir, model.params)
  return model.export(carried)
