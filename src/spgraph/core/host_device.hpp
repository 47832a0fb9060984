// SPG_HOST_DEVICE: marks a function that host code and device code both call (nvcc compiles it
// for both; a host compiler sees a plain function).
#pragma once

#if defined(__CUDACC__)
#define SPG_HOST_DEVICE __host__ __device__
#else
#define SPG_HOST_DEVICE
#endif
