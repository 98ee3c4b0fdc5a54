"""SimPy model of LLM serving driven by the shared policy (see DESIGN.md; filled in by the simulator issue)."""

from pagesim.engine import COMPILED  # noqa: F401  (and, before any compiled module of sim loads, the build's guard)
