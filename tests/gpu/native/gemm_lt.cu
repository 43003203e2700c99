// cuBLASLt: a bf16 matmul with fp32 accumulation, a bias epilogue and a workspace, run in a loop
// (a serving step's steady state: the same launches on the same buffers), checked on the host.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <vector>
#include "check.h"

int main(int argc, char** argv) {
  const int m = 512, n = 256, k = 384, steps = argc > 1 ? std::atoi(argv[1]) : 20;
  std::vector<float> ha(m * k), hb(k * n), hbias(m), hc(m * n), ref(m * n);
  std::vector<__nv_bfloat16> ha16(m * k), hb16(k * n);
  for (int i = 0; i < m * k; ++i) ha16[i] = __float2bfloat16(pattern(i, 5) - 0.75f), ha[i] = __bfloat162float(ha16[i]);
  for (int i = 0; i < k * n; ++i) hb16[i] = __float2bfloat16(pattern(i, 6) - 0.75f), hb[i] = __bfloat162float(hb16[i]);
  for (int i = 0; i < m; ++i) hbias[i] = pattern(i, 7);
  __nv_bfloat16 *a, *b;
  float *bias, *c;
  void* workspace;
  const size_t workspace_size = 32 << 20;
  CHECK(cudaMalloc(&a, ha16.size() * sizeof(__nv_bfloat16)));
  CHECK(cudaMalloc(&b, hb16.size() * sizeof(__nv_bfloat16)));
  CHECK(cudaMalloc(&bias, hbias.size() * sizeof(float)));
  CHECK(cudaMalloc(&c, hc.size() * sizeof(float)));
  CHECK(cudaMalloc(&workspace, workspace_size));
  CHECK(cudaMemcpy(a, ha16.data(), ha16.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(b, hb16.data(), hb16.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(bias, hbias.data(), hbias.size() * sizeof(float), cudaMemcpyHostToDevice));
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  cublasLtHandle_t handle;
  CHECK_BLAS(cublasLtCreate(&handle));
  cublasLtMatmulDesc_t op;
  CHECK_BLAS(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  CHECK_BLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
  CHECK_BLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  cublasLtMatrixLayout_t la, lb, lc;  // column-major: C (m x n) = A (m x k) * B (k x n) + bias
  CHECK_BLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, m, k, m));
  CHECK_BLAS(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, n, k));
  CHECK_BLAS(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, m, n, m));
  cublasLtMatmulPreference_t preference;
  CHECK_BLAS(cublasLtMatmulPreferenceCreate(&preference));
  CHECK_BLAS(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &workspace_size, sizeof workspace_size));
  cublasLtMatmulHeuristicResult_t heuristic = {};
  int found = 0;
  CHECK_BLAS(cublasLtMatmulAlgoGetHeuristic(handle, op, la, lb, lc, lc, preference, 1, &heuristic, &found));
  if (found == 0) {
    std::fprintf(stderr, "cublasLt found no algorithm\n");
    return 2;
  }
  const float one = 1.0f, zero = 0.0f;
  for (int step = 0; step < steps; ++step)
    CHECK_BLAS(cublasLtMatmul(handle, op, &one, a, la, b, lb, &zero, c, lc, c, lc, &heuristic.algo, workspace,
                            workspace_size, stream));
  CHECK(cudaStreamSynchronize(stream));
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      double sum = hbias[i];
      for (int p = 0; p < k; ++p) sum += static_cast<double>(ha[i + p * m]) * hb[p + j * k];
      ref[i + j * m] = static_cast<float>(sum);
    }
  CHECK(cudaMemcpy(hc.data(), c, hc.size() * sizeof(float), cudaMemcpyDeviceToHost));
  expect_close("cublasLt bf16 matmul + bias", hc.data(), ref.data(), m * n, 1e-2f);
  std::printf("gemm_lt ok: %d steps of a %dx%dx%d bf16 matmul with bias\n", steps, m, n, k);
  cublasLtMatmulPreferenceDestroy(preference);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(op);
  CHECK_BLAS(cublasLtDestroy(handle));
  CHECK(cudaStreamDestroy(stream));
  for (void* p : {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(bias), static_cast<void*>(c),
                  workspace})
    CHECK(cudaFree(p));
  return 0;
}
