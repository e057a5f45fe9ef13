"""CUDA from Python without libtorch: NVRTC compilation with its content-addressed cache, loaded
modules and their kernels, and the facts of the device (architecture, libraries found)."""
