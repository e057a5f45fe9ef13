/* timing.c: see DESIGN.md; filled in by its own change. */
#include "cudaforge.h"

int cf_timing_exec(PyObject *m)
{
    (void)m;
    return 0;
}
