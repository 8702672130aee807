"""Estimates before and while a sweep runs: durations, learned GPU memory needs, the simulated clock and `autotune
plan`."""
