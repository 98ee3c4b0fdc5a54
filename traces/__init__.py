"""Trace loaders and synthetic workload generators (see DESIGN.md; filled in by the traces issue)."""
