"""Your own training loop on jaxsync's low-level runtime: a parameter server and its workers, by hand.

``jaxsync launch`` runs this for you from a config; here each piece is in view.
The server (``jaxsync.dist.ParameterServer``) applies the strategy's server rule
to every gradient that arrives; each worker (``jaxsync.dist.run_worker``) pulls
the parameters, computes a gradient on its own batches and pushes it. Here the
workers are threads of this process; on a cluster each runs in a process of its
own (``address`` and ``token`` reach it by your own means, or by
``jax.distributed``'s key-value store as ``jaxsync launch`` does).

The model is BatchNormCnn (my_models.py): BatchNorm statistics and dropout.
Its state rides beside the parameters: ``with_model_state`` makes the
strategy's rules see the parameters alone, ``WorkerData(..., rng=True)`` gives
every batch the numbers its dropout draws from.

Run from this folder:  python own_loop.py
"""

from __future__ import annotations

import threading

import jaxsync


def train(num_workers: int = 2, num_events: int = 600, seed: int = 0):
  """Trains BatchNormCnn on digits with ASP on a real parameter server; returns (trained module, history)."""
  digits = jaxsync.datasets.load("digits", seed=seed)
  model = jaxsync.models.make(
    "my_models:BatchNormCnn", input_shape=digits.input_shape, num_classes=digits.num_classes, seed=seed
  )
  strategy = jaxsync.strategies.make("asp", num_workers, learning_rate=0.05)
  if model.has_state:
    strategy = jaxsync.strategies.with_model_state(strategy)
  data = jaxsync.sim.WorkerData(
    digits.train, num_workers=num_workers, batch_size=32, seed=seed, rng=model.uses_rng
  )
  loss_fn = jaxsync.models.classification_loss(model)
  eval_fn = jaxsync.models.classification_metrics(model, digits.test["image"], digits.test["label"])

  server = jaxsync.dist.ParameterServer(strategy, eval_fn=eval_fn, eval_every=200)
  state = server.init(model.params, seed)

  def work(worker: int) -> None:
    jaxsync.dist.run_worker(
      strategy, loss_fn, data, model.params, worker=worker, address=server.address, token=server.token
    )

  workers = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(num_workers)]
  for thread in workers:
    thread.start()
  state, records = server.advance(state, num_events)  # serves until num_events gradients are applied
  server.stop()  # tells the workers to stop
  for thread in workers:
    thread.join()
  history = server.history(records, state)
  return model.export(state.params), history, server.evaluate(state.params)


if __name__ == "__main__":
  trained, history, final = train()
  print(f"{history.updates} updates, mean staleness {history.mean_staleness:.2f}")
  print(f"test accuracy {final['accuracy']:.3f} (running statistics, eval mode)")
  print(f"the running mean of the BatchNorm, first channels: {trained.norm.mean[...][:4]}")
