"""python -m runner.run RUN_DIR: train a run folder its caller prepared (runner/run/process.py)."""
import sys

from runner.run.process import main

sys.exit(main(sys.argv[1:]))
