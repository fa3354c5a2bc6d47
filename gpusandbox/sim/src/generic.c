/*
 * The body of every other simulated driver library (libnvidia-cfg,
 * libnvidia-ptxjitcompiler, libEGL_nvidia, ...) and of the loader-cache
 * padding libraries.  One build serves them all: the builder links it once
 * with a placeholder SONAME and writes each copy with its own SONAME in place
 * of the placeholder (same length, NUL padded), so dozens of distinct real
 * ELF libraries cost one compiler run.  It needs no libc, which keeps the
 * padding libraries small.
 */
#ifndef SIM_LIB_VERSION
#define SIM_LIB_VERSION "0.0.0"
#endif

const char gpusandbox_sim_library_version[] = SIM_LIB_VERSION;

const char *gpusandbox_sim_library(void)
{
    return "gpusandbox simulated NVIDIA driver library " SIM_LIB_VERSION;
}
