"""What a model is to the runtimes: its parameters and, beside them, the state that is not a parameter.

A model with no state (no BatchNorm statistics, no counters) is carried as its
parameter tree, as always. A model with state is carried as one tree of two
parts, ``{"params": theta, "model_state": s}``: every runtime stacks it per
worker, sends it, averages it and checkpoints it as one tree, while the rules
see only ``theta`` (:func:`jaxsync._src.rules.model_state.keep_model_state`).

The state's gradient slot carries its change: the loss of a model with state
is built so that ``d loss / d s = s - s'``, with ``s'`` the state after the
training forward pass, and the wrapped rules apply ``-g`` to it. So a worker's
step sets its state to ``s'``, an all-reduce of gradients averages the
workers' new states, and an outer step of DiLoCo averages the workers' states
as it averages their models (docs/guide/own_model.md, "Model state").
"""

from __future__ import annotations

from typing import Any

PARAMS = "params"
MODEL_STATE = "model_state"


def carries_state(tree: Any) -> bool:
  """Whether ``tree`` is a model's parameters and state together (``{"params", "model_state"}``)."""
  return isinstance(tree, dict) and set(tree) == {PARAMS, MODEL_STATE}


def join(params: Any, model_state: Any) -> Any:
  """The tree the runtimes carry: ``params`` alone when there is no state, else both parts."""
  if not model_state:
    return params
  return {PARAMS: params, MODEL_STATE: model_state}


def params_of(tree: Any) -> Any:
  """The trainable parameters of a carried tree (the tree itself for a model without state)."""
  return tree[PARAMS] if carries_state(tree) else tree


def model_state_of(tree: Any) -> Any:
  """The state of a carried tree (``{}`` for a model without state)."""
  return tree[MODEL_STATE] if carries_state(tree) else {}
