// Marks a function that both the host and CUDA kernels call (a plain function outside nvcc).
#ifndef INFINI_COMMON_HOST_DEVICE_H
#define INFINI_COMMON_HOST_DEVICE_H

#ifdef __CUDACC__
#define INFINI_HOST_DEVICE __host__ __device__
#else
#define INFINI_HOST_DEVICE
#endif

#endif
