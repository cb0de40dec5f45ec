"""Tensor/pipeline-parallel GPT layers in Megatron-DeepSpeed's layout, with fused Triton kernels."""

__version__ = "0.1.0"
