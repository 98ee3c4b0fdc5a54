"""SimPy model of LLM serving driven by the shared policy (see DESIGN.md; filled in by the simulator issue)."""
