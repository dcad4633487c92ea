// VMMCKPT_HOST_DEVICE: marks a contract function that kernels call too; plain C++ where nvcc does not compile it.
#pragma once

#ifdef __CUDACC__
#define VMMCKPT_HOST_DEVICE __host__ __device__
#else
#define VMMCKPT_HOST_DEVICE
#endif
