"""``python -m landscape`` (and ``torchrun -m landscape``) run the command line."""

from landscape.cli import main

main()
