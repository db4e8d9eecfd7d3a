"""The schema of `hydra/launcher=slurm` (conf/hydra/launcher/slurm.yaml): hydra-submitit-launcher's
SLURM schema plus `wait`, run by deepinit's SlurmSweepLauncher.

No `from __future__ import annotations` here: Hydra's plugin scan loads this module without
registering it in sys.modules, and dataclasses must then read real annotations, not strings.
"""
from dataclasses import dataclass

from hydra.core.config_store import ConfigStore

from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf


@dataclass
class SlurmSweepConf(SlurmQueueConf):
    _target_: str = "hydra_plugins.deepinit_launcher.launcher.SlurmSweepLauncher"
    # false: return once the job array is queued (follow it with `deepinit sweep status`)
    wait: bool = True


ConfigStore.instance().store(group="hydra/launcher", name="deepinit_slurm_base",
                             node=SlurmSweepConf, provider="deepinit")
