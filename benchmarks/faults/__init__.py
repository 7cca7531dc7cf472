"""The fault campaign: process faults and fuzzed messages against real runs, and its report."""
