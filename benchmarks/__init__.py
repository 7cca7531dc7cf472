"""jaxsync's benchmarks, grouped by the question each answers; run one with ``python -m benchmarks.GROUP.NAME``.

* ``claims``: the papers' claims, decided on results stores (3-5 seeds, Holm, half-budget checks).
* ``speed``: what the code costs (transforms, simulator, parameter server, sharded servers).
* ``faults``: the fault campaign (process faults, fuzzed messages) and its report.
* ``calibration``: the simulated clock against real processes.
* ``pages``: the README's figures and the Results page's verdict table, from the results files.
* ``common``: what they share (the harness, the results store, statistics, tables and plots,
  network-namespace hosts).

Results land in ``benchmarks/results/``; ``benchmarks/run_all.sh`` runs them all. The benchmarks are
not part of the installed library: run them from a checkout, at its root.
"""
