"""The committed results stores are read back by today's code: a report rewritten from a store alone gives the
committed verdicts, so a rerun resumes from the store instead of training every run again.

A run's key hashes its whole config, so a config key added without a place in ``ADDED_KEYS`` changes every
key (``cluster.collective_overhead`` did: every benchmark's ``--report-only`` then found none of its runs).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import pathlib
import shutil

import pytest

from jaxsync._src.app import config as config_lib

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
store = importlib.import_module("benchmarks.common.store")


def test_a_key_added_to_the_config_at_its_default_hashes_as_before_it_existed():
  config = config_lib.load(ROOT / "configs" / "quickstart.yaml")
  data = config_lib.to_dict(config)
  for section, key in store.ADDED_KEYS:
    del data[section][key]
  before = hashlib.sha256(json.dumps(data, sort_keys=True, default=repr).encode()).hexdigest()[:16]
  assert store.config_key(config) == before
  # Any other value is another run.
  changed = config_lib.load(ROOT / "configs" / "quickstart.yaml", ["cluster.collective_overhead=0.001"])
  assert store.config_key(changed) != before


def test_every_config_key_is_either_in_the_stores_format_or_added_at_its_default():
  """The keys a run's config had when the stores were written (2026-11-26), and those added since: a new key
  must join ADDED_KEYS (with the default every stored run had), or every store's keys change."""
  formatted = {
    "data": {"batch_size", "data_dir", "name", "num_examples", "sequence_length"},
    "model": {"hidden", "name", "options"},
    "strategy": {"name", "options", "schedule"},
    "cluster": {"apply_time", "calibration", "compute_time", "device_flops", "emulate_slow_workers", "eval_time",
                "jitter_shape", "link", "message_bytes", "num_workers", "server_bandwidth", "servers",
                "slow_fraction", "slowdown"},
    "run": {"checkpoint_every", "chunk", "eval_every", "eval_every_time", "gradient_batch", "gradients",
            "max_time", "target_accuracy"},
    "compare": {"options", "seeds", "strategies"},
  }  # fmt: skip
  data = config_lib.to_dict(config_lib.load(ROOT / "configs" / "quickstart.yaml"))
  sections = {s for s, v in data.items() if isinstance(v, dict)}
  assert sections == set(formatted), "a config section added: give its keys' defaults a place in ADDED_KEYS"
  for section, keys in formatted.items():
    added = {key for s, key in store.ADDED_KEYS if s == section}
    unknown = set(data[section]) - keys - added
    assert not unknown, f"{section} keys added without a place in ADDED_KEYS: {sorted(unknown)}"


@pytest.mark.parametrize(
  "name",
  [
    "ormo_table",
    "inhad_layouts",
    "adaptive_k_regimes",
    # The language model's 64 runs (about 10 s of reading).
    "low_communication_lm",
    # A store in three parts (881 runs; about 2 min of reading): the heavy tier.
    pytest.param("low_communication", marks=pytest.mark.heavy),
  ],
)
def test_a_report_rewritten_from_the_committed_store_gives_the_committed_verdicts(tmp_path, name):
  for part in store.store_parts(RESULTS / f"{name}_runs.jsonl"):
    shutil.copy(part, tmp_path / part.name)
  module = importlib.import_module(f"benchmarks.claims.{name}")
  committed = json.loads((RESULTS / f"{name}_verdicts.json").read_text())
  # A report whose grids have not been rerun on a validation split yet is rebuilt from its picks on the test set.
  on_test_set = ["--picks-on-test-set"] if committed[0].get("tuned_on") == "test set" else []
  argv = ["--report-only", *on_test_set, "--results-dir", str(tmp_path), "--runs-dir", str(tmp_path / "runs")]
  assert module.main(argv) == 0
  rewritten = json.loads((tmp_path / f"{name}_verdicts.json").read_text())
  assert rewritten == committed
  assert not any("not decided yet" in v["verdict"] for v in rewritten)
