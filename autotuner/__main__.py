"""`python -m autotuner`: the `autotune` command."""
from autotuner.cli import main

if __name__ == "__main__":
    main()
