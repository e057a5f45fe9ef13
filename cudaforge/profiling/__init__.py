"""What a kernel costs on the hardware, and the text the Judge reads about it.

- metrics.py: the metric lists, and what a chip can collect of them (offline);
- occupancy.py: theoretical occupancy and the launch__* metrics;
- l2_flush.py: the L2 flush before a timed run or a profiler pass;
- timing.py: CUDA-event and CUPTI kernel times of a forward;
- roofline.py: the GPU's measured ceilings and a kernel's roofline line;
- profiler.py: the profile of a forward (`profile_forward`, `profile`);
- feedback.py: the compact text the Judge reads;
- gpu.py: torch's view of the GPU the others measure on.
"""
