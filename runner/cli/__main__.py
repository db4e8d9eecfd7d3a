"""`python -m runner.cli` is `deepinit`."""
from runner.cli import main

main()
