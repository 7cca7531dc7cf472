"""Puts this folder on ``sys.path`` (pytest's default import mode does so for a conftest's folder),
compiles fast (XLA's lowest optimization level, the classic CPU emitter), and shares compiled
programs between the suite's processes.

The test folders mirror ``jaxsync/_src``'s layers; the shared helpers
(``helpers``, ``rule_cases``, ``sim_cases``) live here, next to this file.

Many tests compile the same programs: the CLI and launch tests start
``jaxsync`` processes on the same configs, the xdist workers build the same
strategies. A persistent XLA compilation cache in a fresh temporary directory,
set up by the controlling process before the workers start (they and every
process they start inherit it) and removed at the end, compiles each once per
run (the CLI tests: 78 s -> 51-54 s on 2 cores; programs compiled in under 50 ms
are not worth a file). A cached program is the same
executable, so bitwise tests are unaffected; a ``JAX_COMPILATION_CACHE_DIR``
of the user's own is left alone.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_CACHE = pytest.StashKey[str]()


def pytest_configure(config):
  if hasattr(config, "workerinput"):
    return  # an xdist worker: its controller set the environment up
  # The suite's programs are compiled far more often than they run long: XLA's CPU backend at
  # optimization level 0 compiles them with about a fifth less CPU (the benchmark smoke tests: 159 s ->
  # 124 s). Every process of the suite, and every process it starts, compiles alike, so bitwise
  # comparisons compare like with like. A user's own XLA_FLAGS choice is kept.
  # XLA:CPU's newer fusion emitters generate code in about 2.5x the time of the classic elemental
  # emitter (the simulator's event loop of a small model: 0.83 s -> 0.34 s), which the suite's short
  # runs never win back.
  flags = os.environ.get("XLA_FLAGS", "")
  for flag in ("xla_backend_optimization_level=0", "xla_cpu_use_fusion_emitters=false"):
    if flag.split("=")[0] not in flags:
      flags = f"{flags} --{flag}".strip()
  os.environ["XLA_FLAGS"] = flags
  if "JAX_COMPILATION_CACHE_DIR" in os.environ:
    return  # the user's own cache
  path = tempfile.mkdtemp(prefix="jaxsync-tests-xla-")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = path
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.05"
  config.stash[_CACHE] = path


def pytest_unconfigure(config):
  path = config.stash.get(_CACHE, None)
  if path:
    shutil.rmtree(path, ignore_errors=True)
    del os.environ["JAX_COMPILATION_CACHE_DIR"], os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]


@pytest.fixture
def scratch_registries(monkeypatch):
  """The model and dataset registries, as copies: what a test (or an example) registers is gone after it."""
  from jaxsync._src.data.datasets import DATASETS
  from jaxsync._src.models.networks import MODELS

  for registry in (MODELS, DATASETS):
    monkeypatch.setattr(registry, "_builders", dict(registry._builders))
  return MODELS, DATASETS


def _running(process) -> bool:
  import psutil

  try:
    return process.status() != psutil.STATUS_ZOMBIE
  except psutil.NoSuchProcess:
    return False


@pytest.fixture(autouse=True)
def no_process_left_behind():
  """Fails a test that leaves a process it started running (and kills what it left).

  The processes alive before the test (a module fixture's server) are not its own; those it started
  get a few seconds to finish exiting after its last line.
  """
  import psutil

  me = psutil.Process()
  before = {p.pid for p in me.children(recursive=True)}
  yield
  left = [p for p in me.children(recursive=True) if p.pid not in before]
  _, alive = psutil.wait_procs(left, timeout=5)
  alive = [p for p in alive if _running(p)]
  if alive:
    described = []
    for p in alive:
      try:
        described.append(f"{p.pid} ({' '.join(p.cmdline())[:200]})")
        p.kill()
      except psutil.NoSuchProcess:
        pass
    if described:
      pytest.fail(f"the test left {len(described)} process(es) running: {'; '.join(described)}")
