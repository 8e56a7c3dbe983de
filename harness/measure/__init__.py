"""Measuring: the one timing method, the runner's calibrated ceilings, the perf run, Nsight
Compute bytes and the GPU's identity."""
