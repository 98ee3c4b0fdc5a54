"""Synthetic workload generators: arrival processes, length distributions, workloads, presets."""

from pagesim.traces.generate.arrivals import Constant, Gamma, Piecewise, Poisson, parse_arrivals
from pagesim.traces.generate.lengths import Empirical, Fixed, LengthPairs, LogNormal, Uniform, parse_lengths
from pagesim.traces.generate.presets import WORKLOADS, workload_spec
from pagesim.traces.generate.workload import Conversations, Sampling, SystemPrompts, WorkloadSpec, generate

__all__ = [
    "Constant", "Conversations", "Empirical", "Fixed", "Gamma", "LengthPairs", "LogNormal",
    "Piecewise", "Poisson", "Sampling", "SystemPrompts", "Uniform", "WORKLOADS", "WorkloadSpec",
    "generate", "parse_arrivals", "parse_lengths", "workload_spec",
]
