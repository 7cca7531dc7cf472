"""The simulated clock against real processes on shaped network links."""
