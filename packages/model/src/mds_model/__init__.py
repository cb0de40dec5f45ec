"""Tensor/pipeline-parallel GPT layers in Megatron-DeepSpeed's layout, with fused Triton kernels."""
