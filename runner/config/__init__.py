"""Typed configuration: the schemas of every config group and the cross-field rules.

The bottom layer of the package: it imports nothing else from runner/.
"""
from runner.config.convert import config_from_dict, config_from_yaml, to_dict, with_dotlist
from runner.config.resolve import is_resolved, resolve_warmup
from runner.config.schema import (
                                  Config,
                                  DataConfig,
                                  DivergenceConfig,
                                  EarlyStopConfig,
                                  InitConfig,
                                  ModelConfig,
                                  NormConfig,
                                  OptimConfig,
                                  ScheduleConfig,
                                  ToyConfig,
                                  TrainerConfig,
                                  WarmupConfig,
)
from runner.config.validate import CHOICES, ConfigError, validate

__all__ = ["CHOICES", "Config", "ConfigError", "DataConfig", "DivergenceConfig", "EarlyStopConfig",
           "InitConfig", "ModelConfig", "NormConfig", "OptimConfig", "ScheduleConfig", "ToyConfig",
           "TrainerConfig", "WarmupConfig", "config_from_dict", "config_from_yaml", "is_resolved",
           "resolve_warmup", "to_dict", "validate", "with_dotlist"]
