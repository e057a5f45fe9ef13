"""What a kernel costs on the hardware: metric lists, occupancy, the L2 flush, timing, the CUPTI
profile of a forward, the roofline, and the compact text the Judge reads."""
