"""Every benchmark by group: its module, and the command that runs it.

A benchmark ``NAME`` of group ``GROUP`` is the module ``benchmarks.GROUP.NAME``, run from the checkout's
root with ``python -m benchmarks.GROUP.NAME``; its results file is ``benchmarks/results/NAME.md``.
"""

from __future__ import annotations

GROUPS: dict[str, tuple[str, ...]] = {
  "claims": (
    "ormo_table",
    "adaptive_k_comparison",
    "adaptive_k_regimes",
    "ea_wild_comparison",
    "inhad_layouts",
    "low_communication",
    "low_communication_lm",
    "advisor_check",
  ),
  "speed": (
    "performance",
    "ps_throughput",
    "server_bound",
    "sharded_server",
    "node_aggregation",
    "simulator_throughput",
    "transform_overhead",
    "import_time",
    "conv_in_loop",
    "suite_tiers",
    "plan_sweep",
    "sync_overhead",
    "compile_time",
  ),
  "faults": ("fault_campaign", "churn"),
  "calibration": ("sim_vs_real", "plan_vs_published"),
  "pages": ("readme_figures", "results_page"),
}


def known(name: str) -> bool:
  """Whether ``name`` is a benchmark of the catalog (a test's made-up benchmark is not)."""
  return any(name in members for members in GROUPS.values())


def module(name: str) -> str:
  """``benchmarks.GROUP.NAME`` of benchmark ``name``; a ``KeyError`` naming the benchmarks if unknown."""
  for group, members in GROUPS.items():
    if name in members:
      return f"benchmarks.{group}.{name}"
  raise KeyError(
    f"benchmark {name!r} is unknown; expected one of: {', '.join(sorted(sum(GROUPS.values(), ())))}"
  )


def command(name: str) -> str:
  """The command that runs benchmark ``name`` from the checkout's root: ``python -m benchmarks.GROUP.NAME``."""
  return f"python -m {module(name)}"
