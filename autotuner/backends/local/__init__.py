"""Attempts on this machine: processes, their clean-up, ports, peak GPU memory."""
