"""What-if studies and PDF reports (see DESIGN.md; filled in by the studies issue)."""
