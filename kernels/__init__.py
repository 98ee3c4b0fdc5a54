"""Triton paged-attention kernels and their torch reference (see DESIGN.md; filled in by the kernels issue)."""
