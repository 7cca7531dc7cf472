"""The fault campaign's short version: fuzzed frames against a real server, and one run with worker faults.

The fuzzing client is a separate process that speaks the wire protocol over
ZeroMQ; the server runs in this process (``benchmarks.faults.fuzzing``).
Every invalid message must be rejected for its own reason (the server's count
and the ERROR replies, in order), every legitimate push applied exactly once,
nothing else applied; a server that mis-handles one kind of message fails it.
"""

from __future__ import annotations

import argparse

import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks.faults import fault_campaign, fuzzing, report, run_store, unsupervised
from jaxsync._src.distributed import wire
from jaxsync._src.distributed.server import param_server, server_step

FRAMES = 1500


@pytest.fixture(scope="module")
def fuzzed():
  return fuzzing.fuzz(FRAMES, seed=20240611, timeout=120)


def test_every_fuzzed_message_is_rejected_for_its_reason_and_every_legit_push_applied_once(fuzzed):
  r, c = fuzzed, fuzzed.client
  assert r.problems == [] and r.crashed is None
  assert r.messages == FRAMES and sum(c["sent"].values()) == FRAMES
  assert set(c["sent"]) == set(fuzzing.CASES)  # every case was sent
  # The server's count per reason is exactly the invalid messages sent for it.
  assert r.rejected == c["expected"]
  assert set(r.rejected) == {"malformed", "token", "worker", "future_version", "version", "dtype", "shape"}
  assert sum(r.rejected.values()) == FRAMES - c["non_finite"] - c["oversize"]
  # The run's own connections are told why, in order; a foreign or garbled message gets no answer.
  for name in ("member", "stranger"):
    assert c["replies_got"][name] == c["replies_expected"][name]
    assert set(c["replies_got"][name]) <= set(fuzzing.REPLY_REASONS)
  answered = sum(r.rejected[x] for x in fuzzing.REPLY_REASONS)
  assert len(c["replies_got"]["member"]) + len(c["replies_got"]["stranger"]) == answered
  # Oversized frames never reach the server's checks: ZeroMQ closes their connections.
  assert c["oversize"] > 0 and c["oversize_closed"] == c["oversize"] and "oversize" not in c["replies_got"]
  # Worker 0's pushes, and only they, were applied: the version counts them and the parameters are exact.
  assert c["legit_pushes"] > FRAMES // (2 * fuzzing.LEGIT_EVERY) and c["legit_mismatches"] == 0
  assert r.version == c["legit_pushes"] and r.params_exact and r.params_finite
  # Non-finite pushes are arrivals the rule rejects (not message errors), from worker 1 only.
  assert c["non_finite"] > 0 and r.rule_rejected == c["non_finite"]
  assert r.arrivals == c["legit_pushes"] + c["non_finite"]


def test_the_results_file_reports_the_fuzzing_numbers(fuzzed, tmp_path):
  args = argparse.Namespace(size="tiny", runs_dir=tmp_path / "runs", results_dir=tmp_path)
  text, failed = report.write_results(args, ["--quick"], 7, {"fuzz": [fuzzed]}, 1.0)
  assert failed == 0
  assert (tmp_path / "fault_campaign.md").read_text() == text
  assert "| RNG seed | 7 |" in text and "| checks failed | 0 |" in text
  assert f"| fuzzed messages | {FRAMES} |" in text
  for reason, n in fuzzed.rejected.items():
    assert f"| {reason} | {n} | {n} |" in text  # sent against rejected, per reason
  assert f"arrivals the rule rejected: {fuzzed.rule_rejected}." in text
  assert "| elastic DiLoCo and asynchronous local SGD (single server) |" in text  # the churn part's runtime


def test_the_store_gives_back_what_it_was_given_and_report_only_needs_nothing_else(fuzzed, tmp_path):
  store = run_store.RunStore(tmp_path / run_store.STORE_NAME)
  store.put("fuzz", 0, 7, "tiny", {"frames": FRAMES}, run_store.encode("fuzz", fuzzed))
  again = run_store.RunStore(tmp_path / run_store.STORE_NAME)  # read back from the file
  assert again.get("fuzz", 0, 7, "tiny", {"frames": 5}) is None  # other parameters: run again
  assert again.get("fuzz", 0, 8, "tiny", {"frames": FRAMES}) is None  # another seed
  back = run_store.decode("fuzz", again.get("fuzz", 0, 7, "tiny", {"frames": FRAMES}))
  assert back.rejected == fuzzed.rejected and back.messages == fuzzed.messages and back.problems == []
  argv = [
    "--quick",
    "--parts",
    "fuzz",
    "--seed",
    "7",
    "--frames",
    str(FRAMES),
    "--results-dir",
    str(tmp_path),
  ]
  assert fault_campaign.main([*argv, "--report-only"]) == 0
  assert f"| fuzzed messages | {FRAMES} |" in (tmp_path / "fault_campaign.md").read_text()
  # A planned run the store lacks: the report says so, and it is a failed check.
  assert (
    fault_campaign.main([*argv[:-2], "--seed", "8", "--results-dir", str(tmp_path), "--report-only"]) == 1
  )
  assert "the campaign is not complete" in (tmp_path / "fault_campaign.md").read_text()


def _trusts_the_version_it_is_told(monkeypatch):
  """A server that takes a registered worker's version at its word when it has reached it."""
  handle = param_server.ParameterServer._handle

  def trusting(self, state, frames):
    try:
      h = wire.decode_header(frames[1], token=self.token)
      mine = self._transport.worker_of(frames[0].bytes) == h.worker
      counters = self._steps.counters  # what the server checks a push against
      if mine and h.kind == wire.Kind.PUSH and 0 <= h.version <= counters.version:
        counters.pulled_version[h.worker] = h.version
    except (wire.MessageError, IndexError):
      pass
    return handle(self, state, frames)

  monkeypatch.setattr(param_server.ParameterServer, "_handle", trusting)


def _calls_a_wrong_dtype_a_shape_error(monkeypatch):
  decode = wire.decode_payload

  def sloppy(*args, **kwargs):
    try:
      return decode(*args, **kwargs)
    except wire.MessageError as err:
      raise wire.MessageError("shape" if err.reason == "dtype" else err.reason, str(err)) from None

  monkeypatch.setattr(wire, "decode_payload", sloppy)


def _trusts_the_finite_flag(monkeypatch):
  """A server whose step believes the sender's NaN/Inf verdict."""
  monkeypatch.setattr(server_step.guard, "tree_all_finite", lambda tree: jnp.bool_(True))


@pytest.mark.parametrize(
  "mutant, caught",
  [
    (_trusts_the_version_it_is_told, "the parameters are not exactly worker 0's updates"),
    (_calls_a_wrong_dtype_a_shape_error, "rejections by reason differ from the invalid messages sent"),
    (_trusts_the_finite_flag, "the parameters are not finite"),
  ],
)
def test_a_server_that_mishandles_one_kind_of_message_fails_the_checks(monkeypatch, mutant, caught):
  mutant(monkeypatch)
  r = fuzzing.fuzz(300, seed=3, timeout=60)
  assert caught in r.problems, r.problems


@pytest.mark.heavy
def test_a_run_with_a_killed_and_a_stopped_worker_finishes_with_every_update(tmp_path):
  # The kill comes as soon as the workers have joined: a killed worker not yet declared lost (3 s) when
  # the run ends holds process 0's exit for up to 15 s.
  faults = [unsupervised.Fault("kill", 0, 0.0), unsupervised.Fault("stop", 2, 0.3, seconds=1.0)]
  r = unsupervised.worker_fault_run(tmp_path / "asp", "asp", 2000, faults)
  assert r.problems == [] and r.finished and not r.crashed and not r.hung, r.problems
  assert r.consistent and r.lost_updates == 0
  s = r.summary
  assert s["events"] == s["gradients"] == s["updates"] == 2000 and s["rejected"] == 0
  killed, stopped = r.faults
  # Killed: it never finishes (the run may end before its heartbeat times out: not always declared lost).
  assert not killed.survived and {x["worker"] for x in s["lost_workers"]} <= {0}
  # A 1 s stop is shorter than the heartbeat timeout: the worker goes on, its stale push is applied.
  assert stopped.survived and not stopped.declared_lost and not stopped.aborted_by_jax
  assert r.rejections.get("version", 0) == 0 and s["rejected_messages"] == {}
  assert stopped.stale_push is not None and stopped.stale_push > 0
  assert np.isfinite(s["final_loss"])


def _slurm_job(label: str, params: str, notices: int, *, requeued: bool = True):
  from benchmarks.faults.supervised import Injected, SupervisedRun

  faults = [
    Injected(
      kind="term", role=("batch shell", "tasks")[i % 2], process=None, at=100.0 + i, since_start=10.0 * (i + 1),
      event=400 * (i + 1), updates=400 * (i + 1), scope="requeue" if requeued else None,
      restart=i + 1 if requeued else None, checkpoint=400 * (i + 1) + 50 if requeued else None, lost=0,
    )
    for i in range(notices)
  ]  # fmt: skip
  return SupervisedRun(
    part="slurm", runtime="slurm", strategy="allreduce", processes=3, gradients=9000, events=3000,
    faults=faults, planned=notices, restarts=[{"restart": f.restart, "scope": "requeue"} for f in faults if f.restart],
    resumes=[], code=0, summary={"events": 3000, "updates": 3000}, consistent=None, unexplained=[], after_end=[],
    tracebacks=0, params=params, seconds=80.0, problems=[], label=label,
  )  # fmt: skip


def test_the_slurm_part_reports_each_notice_and_compares_the_preempted_job_with_the_uninterrupted_one(
  tmp_path,
):
  args = argparse.Namespace(size="tiny", runs_dir=tmp_path / "runs", results_dir=tmp_path)
  jobs = [_slurm_job("allreduce", "ab12", 2), _slurm_job("allreduce (uninterrupted)", "ab12", 0)]
  text, failed = report.write_results(args, ["--parts", "slurm"], 7, {"slurm": jobs}, 1.0)
  assert failed == 0, text
  assert "## 11. SLURM: jobs preempted (`scancel --signal=TERM`) and requeued" in text
  assert "| allreduce | 2 | 2 | 0 | 3000 / 3000 | yes | 80 |" in text
  assert "SIGTERM the job's batch shell @ event 400" in text and "SIGTERM the job's tasks @ event 800" in text
  assert "the job requeued itself (SLURM restart 2) and resumed from checkpoint 850" in text
  assert (
    "| SLURM jobs (examples/slurm on 3 nodes, --requeue) | 2: 1 SIGTERM to a job's batch shell, 1 SIGTERM to a job's tasks"
    in text
  )
  # Other final parameters than the uninterrupted job's: a failed check that names both.
  jobs[1] = _slurm_job("allreduce (uninterrupted)", "cd34", 0)
  text, failed = report.write_results(args, ["--parts", "slurm"], 7, {"slurm": jobs}, 1.0)
  assert (
    failed == 1 and "slurm allreduce: final parameters ab12 differ from the uninterrupted run's cd34" in text
  )
