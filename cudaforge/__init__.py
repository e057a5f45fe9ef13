"""cudaforge: LLM-written CUDA kernels, proven on the GPU."""
