"""`autotune tune`: its inputs, the knobs, the memory model, the tuners."""
