"""Run assembly: build a run from a config (build.py), its folder on disk (folder.py), the train
verb's function (train.py) and scoring of a finished run (evaluate.py)."""
