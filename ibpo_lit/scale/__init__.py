"""Scaling out: FSDP2 sharding, the strategy that configures it, and what ranks agree on."""
from ibpo_lit.scale.collectives import SINGLE_PROCESS, RankSync
from ibpo_lit.scale.fsdp2 import FSDP2Plan, gathered_weights, is_sharded
from ibpo_lit.scale.strategy import FSDP2Strategy, sharding_plan

__all__ = ["SINGLE_PROCESS", "FSDP2Plan", "FSDP2Strategy", "RankSync", "gathered_weights", "is_sharded", "sharding_plan"]
