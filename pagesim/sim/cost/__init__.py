"""Cost models: how long a scheduler step takes (``base``: the interface; ``roofline``: from presets)."""

from pagesim.sim.cost.base import TERMS, CostModel, StepCost, StepWork
from pagesim.sim.cost.roofline import RooflineCostModel, RooflineParams

__all__ = ["TERMS", "CostModel", "RooflineCostModel", "RooflineParams", "StepCost", "StepWork"]
