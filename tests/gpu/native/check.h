// Every CUDA and cuBLAS call in the native test programs is checked: a failure ends the program
// with status 2 and names the call, so a capture test never passes on a program that failed.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cuda_runtime.h>

#define CHECK(call)                                                                                  \
  do {                                                                                               \
    cudaError_t status_ = (call);                                                                    \
    if (status_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,                     \
                   cudaGetErrorString(status_));                                                     \
      std::exit(2);                                                                                  \
    }                                                                                                \
  } while (0)

// cuBLAS and cuBLASLt calls (the program includes cublas_v2.h or cublasLt.h).
#define CHECK_BLAS(call)                                                                             \
  do {                                                                                               \
    cublasStatus_t status_ = (call);                                                                 \
    if (status_ != CUBLAS_STATUS_SUCCESS) {                                                          \
      std::fprintf(stderr, "%s:%d: %s failed: status %d\n", __FILE__, __LINE__, #call,              \
                   static_cast<int>(status_));                                                       \
      std::exit(2);                                                                                  \
    }                                                                                                \
  } while (0)

// A deterministic, non-zero pattern (never time or verify on all-zero data).
inline float pattern(int i, int salt) { return 0.5f + static_cast<float>((i * 7919 + salt * 104729) % 1000) / 1000.0f; }

inline void expect_close(const char* what, const float* got, const float* want, int n, float tolerance) {
  for (int i = 0; i < n; ++i) {
    float scale = std::abs(want[i]) > 1.0f ? std::abs(want[i]) : 1.0f;
    if (!(std::abs(got[i] - want[i]) <= tolerance * scale)) {
      std::fprintf(stderr, "%s: element %d is %g, expected %g\n", what, i, got[i], want[i]);
      std::exit(3);
    }
  }
}
