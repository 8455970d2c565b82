"""``python -m bertforge`` (and ``torchrun -m bertforge``) is the ``bertforge`` command."""

from .cli import console_main

if __name__ == "__main__":
    console_main()
