"""fa-harness: correctness and performance regression harness for FlashAttention-style kernels."""

__version__ = "0.1.0"
