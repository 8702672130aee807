"""`python -m autotuner.cli`: the `autotune` command."""
from . import main

main()
