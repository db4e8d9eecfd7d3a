"""`init=xavier`: the baseline every paper compares against (methods 1.4)."""
from __future__ import annotations

from runner.init.base import InitScheme
from runner.init.common import fairseq_xavier


class Xavier(InitScheme):
    name = "xavier"

    def apply(self, model, cfg, batch=None) -> dict:
        fairseq_xavier(model, cfg)
        return {"rule": "fairseq default Xavier (methods 1.4, TFX/CLN column)"}
