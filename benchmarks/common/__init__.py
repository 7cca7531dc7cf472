"""What the benchmarks share: the harness, the results store, statistics, tables and plots, the catalog."""
