"""Each part's section of the campaign's results file: its tables, and what they show."""

from __future__ import annotations

import collections
from typing import Any

from benchmarks.common import harness
from benchmarks.faults.fuzzing import CASES, COUNT, LEARNING_RATE, FuzzResult
from benchmarks.faults.settings import HEARTBEAT_TIMEOUT
from benchmarks.faults.supervised import Injected, SupervisedRun
from benchmarks.faults.unsupervised import Fault, RejoinRun, ServerKill, WorkerRun

_OUTCOME = {
  "random_bytes": "malformed",
  "empty_frame": "malformed",
  "truncated_header": "malformed",
  "long_header": "malformed",
  "magic": "malformed",
  "kind_code": "malformed",
  "dtype_code": "malformed",
  "reason_code": "malformed",
  "token": "token",
  "dtype": "dtype",
  "count": "shape",
  "payload_length": "shape",
  "missing_payload": "malformed",
  "extra_frames": "shape (the frames after the header are the payload, end to end)",
  "control_with_payload": "malformed",
  "worker_range": "worker",
  "server_kinds": "malformed (from worker 1) / worker (from a stranger)",
  "impostor": "worker",
  "future_version": "future_version",
  "past_version": "version",
  "non_finite": "an arrival the rule rejects (NaN/Inf check); parameters sent again",
  "oversize": "dropped by ZeroMQ (MAXMSGSIZE), connection closed",
}


def _fuzz_text(r: FuzzResult) -> str:
  c = r.client
  sent = c.get("sent", {})
  rows = [[f"`{name}`", str(sent.get(name, 0)), _OUTCOME[name]] for name in CASES]
  reasons = sorted(set(r.rejected) | set(c.get("expected", {})))
  by_reason = [
    [reason, str(c.get("expected", {}).get(reason, 0)), str(r.rejected.get(reason, 0))] for reason in reasons
  ]
  replies = c.get("replies_got", {})
  in_order = "ERROR replies" not in " ".join(r.problems)
  return "\n".join(
    [
      f"An `asp` server (2 workers, {COUNT} float32 parameters, learning rate {LEARNING_RATE}) in this "
      f"process; one client process sent {r.messages} fuzzed messages on two connections (worker 1's, "
      "which said HELLO, and a stranger's, which never did) and one connection per oversized frame, and "
      f"worker 0's {c.get('legit_pushes', 0)} legitimate pushes in between, in {r.seconds:.1f} s.",
      "",
      harness.table(["case", "messages", "must be"], rows),
      "",
      harness.table(["reason", "invalid messages sent", "rejected by the server"], by_reason),
      "",
      f"- ERROR replies: {len(replies.get('member', []))} to worker 1 and "
      f"{len(replies.get('stranger', []))} to the stranger, each with the expected reason in the expected "
      f"order: {'yes' if in_order else 'no'}; none to a malformed or foreign message, none to an "
      "oversized one.",
      f"- Oversized frames: {c.get('oversize', 0)} sent, {c.get('oversize_closed', 0)} connections closed "
      "by ZeroMQ before the frame was read whole; none reached `rejected_messages`.",
      "- Non-finite pushes (NaN/Inf with the finite flag set, or the flag cleared): "
      f"{c.get('non_finite', 0)}; arrivals the rule rejected: {r.rule_rejected}.",
      f"- Server version {r.version}, worker 0's pushes {c.get('legit_pushes', 0)}; the parameters are "
      f"{'exactly' if r.params_exact else 'NOT'} -2^-9 times the sum of its gradients' multipliers "
      f"(finite: {'yes' if r.params_finite else 'no'}); the server raised: "
      f"{'no' if r.crashed is None else 'yes'}.",
    ]
  )


def _fmt_faults(faults: list[Fault]) -> str:
  parts = []
  for f in faults:
    at = f"event {f.event}" if f.event is not None else f"{f.fraction:.0%}"
    parts.append(
      f"kill w{f.worker} @ {at}" if f.kind == "kill" else f"stop w{f.worker} {f.seconds:.1f} s @ {at}"
    )
  return "; ".join(parts)


def _stop_outcome(f: Fault) -> str:
  lost = "declared lost" if f.declared_lost else "not declared lost"
  end = "aborted by JAX" if f.aborted_by_jax else "finished" if f.survived else "did not finish"
  if f.dropped_staleness is not None:
    stale = f"; its push dropped ({f.dropped_staleness} versions late), it rejoined"
  elif f.stale_push is not None:
    stale = f"; its next push (event {f.stale_event}) applied at staleness {f.stale_push}"
  else:
    stale = "; no push after the stop"
  return f"w{f.worker}: {lost}{stale}; {end}"


def _worker_runs_summary(worker_runs: list[WorkerRun]) -> str:
  """The stopped workers' first pushes and the version rejections, over the part's runs."""
  stops = [f for r in worker_runs for f in r.faults if f.kind == "stop"]
  lost = [f for f in stops if f.declared_lost]
  applied = [f.stale_push for f in lost if f.stale_push is not None]
  dropped = [f.dropped_staleness for f in lost if f.dropped_staleness is not None]
  version = sum(r.rejections.get("version", 0) for r in worker_runs)
  return "\n".join(
    [
      f"- The first push after SIGCONT of a stopped worker the server declared lost: {len(lost)} such stops; "
      f"dropped, coming after the declaration, {len(dropped)}"
      + (f" (up to {max(dropped)} versions late)" if dropped else "")
      + f"; applied, coming before it {len(applied)}"
      + (f" (at staleness up to {max(applied)})" if applied else "")
      + f"; none pushed {len(lost) - len(dropped) - len(applied)}.",
      f"- Applied updates lost: {sum(r.lost_updates or 0 for r in worker_runs)}; pushes rejected for their "
      f"version: {version}.",
    ]
  )


def _workers_text(runs: list[WorkerRun]) -> str:
  rows = []
  for i, r in enumerate(runs):
    s = r.summary or {}
    stops = [_stop_outcome(f) for f in r.faults if f.kind == "stop"]
    lost = ", ".join(f"w{x['worker']}" for x in s.get("lost_workers", [])) or "-"
    rows.append(
      [
        str(i),
        r.strategy,
        _fmt_faults(r.faults),
        "hang" if r.hung else str(r.code),
        f"{s.get('events', '-')} / {s.get('updates', '-')} / {s.get('rejected', '-')}",
        "yes" if r.consistent else "no",
        "-" if r.lost_updates is None else str(r.lost_updates),
        lost,
        "; ".join(stops) or "-",
        str(r.rejections.get("version", 0)),
        str(s.get("max_staleness", "-")),
        f"{r.seconds:.0f}",
      ]
    )
  header = [
    "run",
    "strategy",
    "faults (when: the run's last logged event)",
    "exit",
    "events / updates / rule-rejected",
    "totals agree",
    "updates lost",
    "declared lost",
    "stopped worker",
    "'version' rejections",
    "max staleness",
    "s",
  ]
  stops = [f for r in runs for f in r.faults if f.kind == "stop"]
  short = [f for f in stops if not f.declared_lost]
  long = [f for f in stops if f.declared_lost]
  kills = [f for r in runs for f in r.faults if f.kind == "kill"]
  version = sum(r.rejections.get("version", 0) for r in runs)

  def staleness(faults):
    values = sorted(f.stale_push for f in faults if f.stale_push is not None)
    return ", ".join(map(str, values)) or "-"

  dropped = sorted(f.dropped_staleness for f in long if f.dropped_staleness is not None)
  applied = [f for f in long if f.stale_push is not None]

  events = next((r.summary["events"] for r in runs if r.summary), "?")
  ssp = [r for r in runs if r.strategy == "ssp"]
  ssp_back = sorted(
    f.stale_push for r in ssp for f in r.faults if f.declared_lost and f.stale_push is not None
  )
  ssp_other = max((r.other_staleness for r in ssp if r.other_staleness is not None), default=None)
  ssp_note = (
    f" In the ssp runs (a worker at most 3 clocks ahead of the slowest live one) these pushes were "
    f"{', '.join(map(str, ssp_back))} updates stale; every other push of those runs at most {ssp_other}."
    if ssp_back and ssp_other is not None
    else ""
  )
  return "\n".join(
    [
      f"Each run: 1 server + 3 worker processes on this machine, digits MLP, {events} gradients, "
      f"`JAXSYNC_HEARTBEAT_TIMEOUT={HEARTBEAT_TIMEOUT}`. 'totals agree': the summary's events, gradients "
      "and updates, the final checkpoint's per-event records (every accepted arrival released one update, "
      "the version counts them) and the last metrics row agree. 'updates lost': accepted arrivals minus "
      "the updates the run ends with. The seed fixes the faults and the points of the run they come at; "
      "whether a stop of about 3 s outlasts the heartbeat timeout depends on the machine's timing.",
      "",
      harness.table(header, rows),
      "",
      *(
        [
          f"- SIGKILL ({len(kills)}): the process ends with signal 9 and the run finishes with the others; "
          f"{sum(f.declared_lost for f in kills)} of {len(kills)} declared lost before their run ended "
          f"(after the {HEARTBEAT_TIMEOUT} s heartbeat timeout)."
        ]
        if kills
        else []
      ),
      *(
        [
          f"- SIGSTOP shorter than the heartbeat timeout ({len(short)}): the worker is not declared lost; on "
          "SIGCONT it pushes the gradient it computed before the stop, on the version the server sent it, so "
          "the server's version rule accepts it and the rule applies it as a stale gradient "
          f"(staleness {staleness(short)}); it finishes the run: {sum(f.survived for f in short)} of "
          f"{len(short)}."
        ]
        if short
        else []
      ),
      *(
        [
          f"- SIGSTOP longer than the heartbeat timeout ({len(long)}): the server declares the worker lost "
          "and goes on without it. On SIGCONT the worker pushes what it computed before the stop, on the "
          f"version it was sent: dropped {len(dropped)} (counted in the summary's `dropped_gradients`; "
          f"{', '.join(map(str, dropped)) or '-'} versions late), the worker rejoining with the current "
          f"parameters as after a HELLO; applied {len(applied)}, having arrived before the server declared the "
          f"worker lost (which it did later; staleness {staleness(long)}); no push, "
          f"the process ended first: {len(long) - len(dropped) - len(applied)}. The JAX coordination "
          f"client aborts {sum(f.aborted_by_jax for f in long)} of these {len(long)} processes soon after "
          "SIGCONT, the service having marked the task dead (one aborted after rejoining is declared lost "
          f"a second time, hence a worker listed twice); {sum(f.survived for f in long)} finished the run."
          + ssp_note
        ]
        if long
        else []
      ),
      f"- Pushes rejected for their version: {version}. A push is refused when its version is not the one "
      "the server last sent that worker; a stopped worker's push is stale but on its own version: from a "
      "worker still counted live it is applied whatever its staleness (asp has no bound; ssp bounds the "
      "workers' clocks, not a gradient's age), from one declared lost it is dropped.",
    ]
  )


def _same_command_text(o: dict[str, Any]) -> str:
  """What the restart with the launcher's own command line did, from what was measured."""
  if o["hello_at_server"] and o["pushes"] > 0:
    return (
      "- Started with the launcher's own command line and environment (`jaxsync train ...`), it rejoins: "
      f"the server sent it version {', '.join(map(str, o['joined_at']))} and applied its "
      f"{o['pushes']} pushes; the worker of an asynchronous run waits for nothing but the server's "
      "address (a start-up barrier of every process would be a new instance that no other process joins)."
    )
  return (
    "- Started with the launcher's own command line (`jaxsync train ...`), it did not reach the server "
    f"(exit {o['exit']}; its main thread was at {o['waiting_at'] or 'an unknown place'})."
  )


def _rejoin_text(r: RejoinRun) -> str:
  s = r.summary or {}

  def row(label, o):
    return [
      label,
      f"w{o['worker']}",
      "yes" if o["joined_coordination"] else "no",
      "yes" if o["hello_at_server"] else "no",
      ", ".join(map(str, o["joined_at"])) or "-",
      str(o["pushes"]),
      str(o["exit"]),
      o["waiting_at"] or "-",
    ]

  table = harness.table(
    [
      "started again",
      "worker",
      "joined the coordination service",
      "said HELLO to the server",
      "version sent on rejoining",
      "pushes after rejoining",
      "exit",
      "where its main thread was at the end (faulthandler)",
    ],
    [
      row("the launcher's command line and environment", r.same_command),
      row("the same environment, the worker loop alone", r.worker_loop),
    ],
  )
  return "\n".join(
    [
      f"An asp run ({s.get('events', '?')} gradients, exit {r.code}, totals agree: "
      f"{'yes' if r.consistent else 'no'}); two workers killed with SIGKILL early in the run, each started "
      "again at once.",
      "",
      table,
      "",
      "- `jax.distributed` takes back a process with the id of a dead one (the run's tasks are "
      "recoverable): the restarted process initializes and reads the key-value store.",
      _same_command_text(r.same_command),
      "- Started through the worker loop alone (coordination service, heartbeat, the server's address and "
      "token, HELLO), the server takes the worker back: it is sent the current version and its own data "
      "step, and its pushes are applied.",
    ]
  )


def _kills_text(kills: list[ServerKill]) -> str:
  rows = []
  for i, k in enumerate(kills):
    s = k.summary or {}
    rows.append(
      [
        str(i),
        f"{k.killed_at} / {k.updates_logged}",
        f"{k.checkpoint} / {k.checkpoint_updates}",
        ", ".join(map(str, k.resumed_at)) or "-",
        str(k.resumed_from),
        "-" if k.lost_updates is None else str(k.lost_updates),
        "hang" if k.resume_code is None else str(k.resume_code),
        f"{s.get('events', '-')} / {s.get('updates', '-')}",
        f"{k.seconds:.0f}",
      ]
    )
  return "\n".join(
    [
      "asp, 1 server + 3 workers, a checkpoint every 500 events, a metrics row every 50: process 0 killed "
      "with SIGKILL at a random point after the first checkpoint (its workers end when the coordinator "
      "goes), then `jaxsync resume RUN_DIR`.",
      "",
      harness.table(
        [
          "run",
          "last logged event / updates before the kill",
          "last checkpoint: event / updates",
          "versions sent on joining the resumed server",
          "version before its first event (records)",
          "updates lost past the checkpoint",
          "resume exit",
          "final events / updates",
          "s",
        ],
        rows,
      ),
      "",
      "The updates lost are those logged after the last checkpoint (a chunk in progress at the kill, at "
      "most 49 more, was never logged). The resumed server starts from the checkpoint's version, which its "
      "workers are sent on joining, and the run redoes the lost events, so it still ends at its full count.",
    ]
  )


SIGNALS = {"kill": "SIGKILL", "stop": "SIGSTOP/SIGCONT", "term": "SIGTERM", "launcher_term": "SIGTERM"}


def _fault_text(f: Injected) -> str:
  who = f"p{f.process} ({f.role})" if f.process is not None else "the launcher"
  if f.role in ("batch shell", "tasks"):  # a SLURM job's notice
    who = f"the job's {f.role}"
  stop = f" {f.seconds:.1f} s" if f.kind == "stop" else ""
  return f"{SIGNALS[f.kind]}{stop} {who} @ event {f.event}"


def _outcome_text(f: Injected) -> str:
  if f.scope == "process":
    return f"{f.ended}; restarted alone (restart {f.restart})"
  if f.scope == "run":
    return f"{f.ended}; every process restarted from checkpoint {f.checkpoint} (restart {f.restart})"
  if f.scope == "resume":
    return f"exit 75; `jaxsync resume` from checkpoint {f.checkpoint}"
  if f.scope == "requeue":
    return f"exit 75; the job requeued itself (SLURM restart {f.restart}) and resumed from checkpoint {f.checkpoint}"
  return "no restart"


def _supervised_text(part: str, runs: list[SupervisedRun]) -> str:
  run_rows, fault_rows = [], []
  for i, r in enumerate(runs):
    s = r.summary or {}
    scopes = collections.Counter(f.scope for f in r.faults if f.scope)
    run_rows.append(
      [
        str(i) if not r.label else r.label,
        r.strategy,
        str(r.processes),
        f"{len(r.faults)} of {r.planned}",
        "hang" if r.hung else str(r.code),
        f"{s.get('events', '-')} / {s.get('updates', '-')}",
        ", ".join(f"{n} {k}" for k, n in scopes.items()) or "-",
        "-" if r.consistent is None else "yes" if r.consistent else "no",
        "; ".join(r.unexplained) or "-",
        f"{r.seconds:.0f}",
      ]
    )
    for f in r.faults:
      fault_rows.append(
        [
          str(i) if not r.label else r.label,
          _fault_text(f),
          _outcome_text(f),
          "-" if f.completed is None else str(f.completed),
          "-" if f.lost is None else str(f.lost),
          "-" if f.down_seconds is None else f"{f.down_seconds:.1f}",
          "-" if f.recovered_seconds is None else f"{f.recovered_seconds:.1f}",
          "-" if f.rejoined_seconds is None else f"{f.rejoined_seconds:.1f}",
          f.note or "-",
        ]
      )
  runs_table = harness.table(
    [
      "run",
      "strategy",
      "processes",
      "faults injected (of planned)",
      "exit",
      "events / updates",
      "restarts",
      "totals agree",
      "deaths no fault explains",
      "s",
    ],
    run_rows,
  )
  faults_table = harness.table(
    [
      "run",
      "fault (at the last logged event)",
      "what followed",
      "rounds complete (survivors)",
      "lost past the checkpoint",
      "down s",
      "to next progress row s",
      "to rejoined s",
      "note",
    ],
    fault_rows,
  )
  return f"{runs_table}\n\n{faults_table}"


_PART_INTRO = {
  "supervised": (
    "`jaxsync launch -n 4 --max-restarts {restarts}`, asp and ssp in turn (1 server, 3 workers), "
    "`JAXSYNC_HEARTBEAT_TIMEOUT={hb}`: workers SIGKILLed, stopped (SIGSTOP, SIGCONT 1-5 s later) or sent "
    "SIGTERM (a preemption notice: the worker leaves about 10 s later with exit 75), the server killed once "
    "per run and sent SIGTERM in every other run; one worker of each run is never faulted. Each fault comes "
    "a random 1-3 s after the run recovered from the one before (a worker restarted alone is not faulted again until it has rejoined, and the last worker up is never faulted: the server stops once every worker is lost). A dead worker is restarted alone and "
    "rejoins; a dead server restarts every process from the last checkpoint (one every 1,000 events)."
  ),
  "sharded": (
    "`jaxsync launch -n 4 --set cluster.servers=2 --max-restarts {restarts}`: asp on 2 server shards "
    "(processes 0, 1) and 2 workers; worker faults as above, and one shard (0 or 1) killed per run: every "
    "process restarts from the last checkpoint."
  ),
  "inhad": (
    "`jaxsync launch -n 5 --max-restarts {restarts}`: InHAD, 2 nodes of 2 workers, each node's aggregator "
    "in its first worker's process. Per run, in a random order: a worker stopped, a worker that is not an "
    "aggregator killed, an aggregator killed (its node is dropped whole), the server killed (every process "
    "restarts from the last checkpoint, the dropped nodes with it); then another stop. Dead InHAD workers "
    "are not restarted: the run goes on without them."
  ),
  "sync": (
    "`jaxsync launch -n 3 --max-restarts {restarts}`, allreduce and bsp in turn (3 workers, one per "
    "process), a checkpoint every 200 rounds, a metrics row every 50: per run, in a random order, a process "
    "other than 0 killed, process 0 killed, a process stopped 1-5 s, a process sent SIGTERM (the processes "
    "agree to stop at the chunk's end with a checkpoint: exit 75, then `jaxsync resume`), and SIGTERM to "
    "the launcher. A death restarts every process from the last checkpoint; when a process other than 0 "
    "dies, process 0 first saves every completed round ('rounds complete': what the survivors said), and "
    "when process 0 dies, process 1 does (the launcher hosts the coordination service, so process 0's death "
    "does not end the others): nothing is lost."
  ),
  "churn": (
    "`jaxsync launch -n 4 --max-restarts {restarts}`, DiLoCo with `membership: elastic` and asynchronous "
    "local SGD in turn (H = 10; 1 server, 3 workers), `JAXSYNC_HEARTBEAT_TIMEOUT={hb}`: workers SIGKILLed, "
    "stopped (SIGSTOP, SIGCONT 1-5 s later) or sent SIGTERM, 6 faults a run, a random 1-3 s after the run "
    "recovered from the one before; one worker of each run is never faulted. The server goes on without a "
    "worker that is gone (DiLoCo's rounds average the pseudo-gradients they have); a dead worker is "
    "restarted alone and joins again. Events are DiLoCo's rounds, or asynchronous local SGD's pushes."
  ),
}


def against_uninterrupted(runs: list[SupervisedRun], part: str, problems: list[str]):
  """Each interrupted run, and whether its final parameters are its uninterrupted twin's (label ``X
  (uninterrupted)``): "yes", "no" (a failed check, added to ``problems``), or None without a twin."""
  by_label = {r.label: r for r in runs}
  for r in runs:
    if r.label.endswith("(uninterrupted)"):
      continue
    ref = by_label.get(f"{r.label} (uninterrupted)")
    same = None if ref is None else "yes" if r.params is not None and r.params == ref.params else "no"
    if same == "no":
      problems.append(
        f"{part} {r.label}: final parameters {r.params} differ from the uninterrupted run's {ref.params}"
      )
    yield r, same


def _preempt_text(runs: list[SupervisedRun]) -> tuple[str, list[str]]:
  """The preempted runs against their uninterrupted twins; returns the text and the failed checks."""
  rows, problems = [], []
  for r, same in against_uninterrupted(runs, "preempt", problems):
    stop = next((f for f in r.faults if f.kind == "launcher_term"), None)
    rows.append(
      [
        r.label,
        "-" if stop is None else str(stop.event),
        "-" if stop is None else str(stop.checkpoint),
        "-" if stop is None or stop.lost is None else str(stop.lost),
        "hang" if r.hung else str(r.code),
        f"{(r.summary or {}).get('events', '-')} / {(r.summary or {}).get('updates', '-')}",
        same or "not deterministic: totals checked instead",
        "-" if r.consistent is None else "yes" if r.consistent else "no",
        f"{r.seconds:.0f}",
      ]
    )
    if stop is None:
      problems.append(f"preempt {r.label}: the launcher was never sent SIGTERM")
    elif stop.scope != "resume":
      problems.append(f"preempt {r.label}: SIGTERM to the launcher did not end the run with exit 75")
  table = harness.table(
    [
      "run",
      "last logged event at SIGTERM",
      "checkpoint at the stop",
      "events lost",
      "exit after `jaxsync resume`",
      "final events / updates",
      "final parameters = the uninterrupted run's",
      "totals agree",
      "s",
    ],
    rows,
  )
  intro = (
    "SIGTERM to the launcher at a random point of the run: it passes the notice on, every process stops at "
    "its next chunk boundary with a checkpoint, the launcher exits 75; then `jaxsync resume RUN_DIR`. The "
    "runs whose runtime is deterministic (the synchronous loop, a parameter server with one worker) are "
    "compared with an uninterrupted run of the same config (sha256 of the final parameters); with 3 "
    "asynchronous workers the order of arrivals is the machine's, so the totals are checked instead: the "
    "resumed run's events are the checkpoint's plus the rest, every accepted arrival an update."
  )
  return f"{intro}\n\n{table}", problems
