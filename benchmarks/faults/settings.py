"""The fault campaign's name, parts, sizes and timeouts: what its modules share."""

from __future__ import annotations

NAME = "fault_campaign"
TITLE = "Fault campaign: fuzzed frames; killed, stopped and preempted processes of every runtime"
PARTS = (
  "fuzz",
  "workers",
  "rejoin",
  "server",
  "supervised",
  "sharded",
  "inhad",
  "sync",
  "preempt",
  "churn",
  "slurm",
)
ALL_SLURM = ("allreduce", "asp", "diloco")  # examples/slurm's jobs; the synchronous ones also uninterrupted
# gradients per SLURM job: all-reduce 3,000 rounds, asp 6,000 arrivals, DiLoCo 3,000 rounds of 3 x 4 steps
GRADIENTS_SLURM = {"allreduce": 9000, "asp": 6000, "diloco": 36000}
ALL_PREEMPT = ("asp, 1 worker", "asp, 2 shards, 1 worker", "allreduce, 3 processes", "asp, 3 workers")
SIZES = {
  "tiny": {
    "frames": 1000, "runs": 1, "server_kills": 0, "gradients": 2000,
    "supervised": 0, "sharded": 0, "inhad": 0, "sync": 1, "preempt": (),
    "gradients_supervised": 0, "gradients_sharded": 0, "gradients_inhad": 0, "gradients_sync": 800,
    "gradients_preempt": (0, 0), "churn": 0, "gradients_churn": 0, "parts": ("fuzz", "workers", "sync"),
    "slurm": (), "notices_slurm": 0,
  },
  "default": {
    "frames": 50000, "runs": 8, "server_kills": 2, "gradients": 4000,
    "supervised": 3, "sharded": 3, "inhad": 3, "sync": 3, "preempt": ALL_PREEMPT,
    "gradients_supervised": 24000, "gradients_sharded": 8000, "gradients_inhad": 10000, "gradients_sync": 30000,
    "gradients_preempt": (4000, 1500), "churn": 2, "gradients_churn": 300000, "parts": PARTS,
    "slurm": ALL_SLURM, "notices_slurm": 2,
  },
  "full": {
    "frames": 100000, "runs": 20, "server_kills": 5, "gradients": 6000,
    "supervised": 8, "sharded": 8, "inhad": 8, "sync": 8, "preempt": ALL_PREEMPT,
    "gradients_supervised": 24000, "gradients_sharded": 8000, "gradients_inhad": 10000, "gradients_sync": 30000,
    "gradients_preempt": (4000, 1500), "churn": 4, "gradients_churn": 300000, "parts": PARTS,
    "slurm": ALL_SLURM, "notices_slurm": 3,
  },
}  # fmt: skip
HEARTBEAT_TIMEOUT = 3  # seconds; a stop of 1-5 s falls on either side of it
RUN_TIMEOUT = 240.0  # seconds a launched run may take before it counts as a hang
