"""Sweeps inside a Slurm allocation: its nodes and GPUs are the cluster, each attempt is a job step.

`options` declares its flags (read by the command line without importing the rest), `allocation` describes an
allocation and runs Slurm's commands, `request` asks for one (its batch script the `keeper` that gives it back
once its holder is gone), `executor` runs attempts as steps, `watch` follows the allocation's nodes and end while
a sweep runs; `parse` reads Slurm's text."""
