"""The judging core: cases and grids, the float64 oracle, the tolerance rule, buffers and
poison, FLOPs and the IO model, results, and `check_case`. It imports no candidate
implementation and nothing that needs a GPU at import time (ARCHITECTURE.md)."""
