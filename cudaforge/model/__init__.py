"""A user's nn.Module: capture, hot spots extracted as problems, verified kernels swapped in, the
kernel store, and `optimize` / `apply_stored`."""
