"""Candidates: the CUDA kernel variants (manifests, size expressions, compilation, launch),
the PyTorch SDPA peers, the CPU algorithm models and planted bugs, and the registry that
discovers them. Nothing here imports the oracle or the tolerance rule."""
