"""Cost models: how long a scheduler step takes (``base``: the interface; ``roofline``: from presets)."""

from sim.cost.base import TERMS, CostModel, StepCost, StepWork
from sim.cost.roofline import RooflineCostModel, RooflineParams

__all__ = ["TERMS", "CostModel", "RooflineCostModel", "RooflineParams", "StepCost", "StepWork"]
