"""Training: the loop (`Trainer.step` / `Trainer.run` with callbacks), optimizers, schedules."""
