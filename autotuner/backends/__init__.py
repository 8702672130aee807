"""Where attempts run: this machine (local), SSH hosts (ssh), a Slurm allocation (slurm), and what they share (the
attempt's files, its command, its tag, its exit status)."""
