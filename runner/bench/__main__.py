"""python -m runner.bench SPEC.json OUT.json: the child process of run_isolated (one entry)."""
import sys

from runner.bench.workers import worker_main

sys.exit(worker_main(sys.argv[1:]))
