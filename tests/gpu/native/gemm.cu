// cuBLAS: an SGEMM and a GemmEx (fp16 inputs, fp32 accumulation and output), checked on the host.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cmath>
#include <vector>
#include "check.h"

int main() {
  const int m = 256, n = 192, k = 320;
  std::vector<float> ha(m * k), hb(k * n), hc(m * n), ref(m * n);
  std::vector<__half> ha16(m * k), hb16(k * n);
  for (int i = 0; i < m * k; ++i) ha[i] = pattern(i, 3) - 0.75f, ha16[i] = __float2half(ha[i]);
  for (int i = 0; i < k * n; ++i) hb[i] = pattern(i, 4) - 0.75f, hb16[i] = __float2half(hb[i]);
  float *a, *b, *c, *c16;
  __half *a16, *b16;
  CHECK(cudaMalloc(&a, ha.size() * sizeof(float)));
  CHECK(cudaMalloc(&b, hb.size() * sizeof(float)));
  CHECK(cudaMalloc(&c, hc.size() * sizeof(float)));
  CHECK(cudaMalloc(&c16, hc.size() * sizeof(float)));
  CHECK(cudaMalloc(&a16, ha16.size() * sizeof(__half)));
  CHECK(cudaMalloc(&b16, hb16.size() * sizeof(__half)));
  CHECK(cudaMemcpy(a, ha.data(), ha.size() * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(b, hb.data(), hb.size() * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(a16, ha16.data(), ha16.size() * sizeof(__half), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(b16, hb16.data(), hb16.size() * sizeof(__half), cudaMemcpyHostToDevice));
  cublasHandle_t handle;
  CHECK_BLAS(cublasCreate(&handle));
  const float one = 1.0f, zero = 0.0f;
  // column-major: C (m x n) = A (m x k) * B (k x n)
  CHECK_BLAS(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, a, m, b, k, &zero, c, m));
  CHECK_BLAS(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, a16, CUDA_R_16F, m, b16, CUDA_R_16F, k,
                          &zero, c16, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  CHECK(cudaDeviceSynchronize());
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      double sum = 0;
      for (int p = 0; p < k; ++p) sum += static_cast<double>(ha[i + p * m]) * hb[p + j * k];
      ref[i + j * m] = static_cast<float>(sum);
    }
  CHECK(cudaMemcpy(hc.data(), c, hc.size() * sizeof(float), cudaMemcpyDeviceToHost));
  expect_close("sgemm", hc.data(), ref.data(), m * n, 2e-2f);  // TF32 may be on by default
  CHECK(cudaMemcpy(hc.data(), c16, hc.size() * sizeof(float), cudaMemcpyDeviceToHost));
  expect_close("gemm-ex fp16", hc.data(), ref.data(), m * n, 5e-2f);
  std::printf("gemm ok: sgemm and gemm-ex %dx%dx%d\n", m, n, k);
  CHECK_BLAS(cublasDestroy(handle));
  for (void* p : {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(c), static_cast<void*>(c16),
                  static_cast<void*>(a16), static_cast<void*>(b16)})
    CHECK(cudaFree(p));
  return 0;
}
