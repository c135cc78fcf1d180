"""Placement: where each tensor (and each expert of an expert tensor) lives, and why.

    rules.py       TensorOverride, the -ot syntax and its expert sets, llama.cpp's --cpu-moe / --n-cpu-moe
    plan.py        Plan: where each tensor and expert lives and why; Plan.explain(), device_of(name, expert)
    build.py       plan(model, rules) -> Plan: first match wins per tensor and expert
    memory.py      estimate(plan, context) -> bytes of weights, KV cache and scratch per device
    strategies.py  functions that return rules: fit (llama.cpp's --fit), hot_experts (a routing trace)
    cli.py         the placement flags of every command, `moert fit`

Imports flow one way: rules <- plan <- build <- memory <- strategies <- cli.
"""

from moert.placement.build import build, plan
from moert.placement.memory import DeviceEstimate, Estimate, estimate
from moert.placement.plan import Placement, Plan
from moert.placement.rules import (
    EXPERT_REGEX,
    TensorOverride,
    expert_layer_regex,
    format_experts,
    format_overrides,
    moe_rules,
    normalize_overrides,
    parse_experts,
    parse_overrides,
)
from moert.placement.strategies import FitResult, auto_plan, fit, hot_experts

__all__ = [
    "EXPERT_REGEX", "DeviceEstimate", "Estimate", "FitResult", "Placement", "Plan", "TensorOverride", "auto_plan",
    "build", "estimate", "expert_layer_regex", "fit", "format_experts", "format_overrides", "hot_experts",
    "moe_rules", "normalize_overrides", "parse_experts", "parse_overrides", "plan",
]
