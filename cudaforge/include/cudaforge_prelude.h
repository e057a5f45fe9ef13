/* Included before every source cudaforge.compile() builds: what CUDA C++ written for nvcc expects
 * to find without an include (INFINITY, FLT_MAX, int64_t, INT_MAX), since NVRTC ships no C
 * standard headers. */
#pragma once
#include <stdint.h>
#include <limits.h>
#include <float.h>
#include <math.h>
