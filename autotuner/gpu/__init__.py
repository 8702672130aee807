"""GPU facts: types and sizes as people and NVML write them, and this machine's GPUs (NVML)."""
