"""autotuner: run a space of DeepSpeed configurations across GPU slots and keep the fastest."""

__version__ = "0.1.0"
