"""Text read offline: the Jargon File as byte-level next-token examples, a deterministic held-out tail."""

from __future__ import annotations

import gzip
import os
import pathlib

import numpy as np
import pytest

import jaxsync
from jaxsync._src.data.datasets import JARGON_DIR, JARGON_ENV

# Where the library looks too: $JARGON_DIR (scripts/test.sh sets it where dpkg skips /usr/share/doc).
CORPUS = pathlib.Path(os.environ.get(JARGON_ENV) or JARGON_DIR) / "jargon.txt.gz"


def test_text_sequences_pair_each_token_with_the_next_and_hold_out_the_tail():
  train, test = jaxsync.datasets.text_sequences(np.arange(1000), sequence_length=8, test_fraction=0.1)
  # 900 tokens for training: (900 - 1) // 8 = 112 windows; the test split starts at token 900.
  assert train["tokens"].shape == train["label"].shape == (112, 8)
  assert test["tokens"].shape == test["label"].shape == (12, 8)
  assert train["tokens"].dtype == train["label"].dtype == np.int32
  np.testing.assert_array_equal(train["label"][:, :-1], train["tokens"][:, 1:])  # the next token
  np.testing.assert_array_equal(train["tokens"].ravel(), np.arange(112 * 8))  # consecutive windows
  assert test["tokens"][0, 0] == 900 and train["label"].max() < 900  # no example crosses the cut
  with pytest.raises(ValueError, match="sequence_length=200 is invalid; expected at most 99"):
    jaxsync.datasets.text_sequences(np.arange(1000), sequence_length=200, test_fraction=0.1)


def test_jargon_from_debians_package_is_byte_tokens_split_the_same_every_time():
  assert CORPUS.is_file(), f"{CORPUS} is missing: apt-get install jargon-text (scripts/test.sh installs it)"
  data = jaxsync.datasets.load("jargon")
  text = np.frombuffer(gzip.decompress(CORPUS.read_bytes()), np.uint8)
  assert data.input_key == "tokens" and data.num_classes == 256 and data.input_shape == (64,)
  n_train, n_test = len(data.train["tokens"]), len(data.test["tokens"])
  assert 24_000 < n_train < 27_000 and 1_200 < n_test < 1_400  # 1.68 MB: 95% / 5%
  assert data.train["tokens"].shape == data.train["label"].shape == (n_train, 64)
  np.testing.assert_array_equal(data.train["tokens"][0], text[:64])  # the text from its first byte
  np.testing.assert_array_equal(data.train["label"][0], text[1:65])
  assert bytes(text[:64].tobytes()).strip().startswith(b"The Jargon File")
  # The test split is the text's tail, whatever the seed (the seed orders the workers' batches).
  cut = len(text) - round(0.05 * len(text))
  np.testing.assert_array_equal(data.test["tokens"][0], text[cut : cut + 64])
  again = jaxsync.datasets.load("jargon", seed=3)
  for split in ("train", "test"):
    for key in ("tokens", "label"):
      np.testing.assert_array_equal(getattr(again, split)[key], getattr(data, split)[key])
  short = jaxsync.datasets.load("jargon", sequence_length=16)
  assert short.input_shape == (16,) and 4 * n_train <= len(short.train["tokens"]) <= 4 * n_train + 4


def test_jargon_reads_a_file_or_directory_given_and_names_the_package_when_missing(tmp_path, monkeypatch):
  (tmp_path / "jargon.txt").write_bytes(b"hello, hacker world. " * 100)  # 2,100 bytes
  for where in (tmp_path, tmp_path / "jargon.txt"):
    data = jaxsync.datasets.load("jargon", data_dir=str(where), sequence_length=10)
    assert data.train["tokens"].shape == (199, 10) and data.test["tokens"].shape == (10, 10)
  monkeypatch.setenv("JARGON_DIR", str(tmp_path))
  assert jaxsync.datasets.load("jargon", sequence_length=10).train["tokens"].shape == (199, 10)
  monkeypatch.setenv("JARGON_DIR", str(tmp_path / "nowhere"))
  with pytest.raises(ValueError) as err:
    jaxsync.datasets.load("jargon")
  message = str(err.value)
  assert "\n" not in message and "$JARGON_DIR" in message and "nowhere" in message
  assert "apt-get install jargon-text" in message and "Nothing is downloaded" in message
  with pytest.raises(ValueError, match="data_dir '.*elsewhere' holds no jargon.txt.gz or jargon.txt"):
    jaxsync.datasets.load("jargon", data_dir=str(tmp_path / "elsewhere"))
