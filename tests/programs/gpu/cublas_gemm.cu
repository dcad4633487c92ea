// GPU test program: cuBLAS fp32 GEMMs with pedantic (no TF32) math on deterministic inputs; prints
// ptr lines for its buffers and bitwise checksums of the results for native-vs-shim comparison.
#include "gpu_check.cuh"

#include <cublas_v2.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

// VMMCKPT_CHECK of cuBLAS calls: their status type's name, where argument-dependent lookup finds it.
inline const char* error_name(cublasStatus_t s) { return cublasGetStatusName(s); }

namespace {

using gpu_check::mix32;

// Exact inputs: multiples of 1/8 in [-1, 1]. Every product and partial sum of a K <= 4096 dot
// product is exactly representable in fp32, so the result is exact in any summation order and
// can be checked against a host reference bit for bit.
std::vector<float> exact_matrix(size_t n, uint32_t seed) {
  std::vector<float> m(n);
  for (size_t i = 0; i < n; ++i)
    m[i] = static_cast<float>(static_cast<int>(mix32(static_cast<uint32_t>(i) ^ seed) % 17) - 8) / 8.0f;
  return m;
}

// Generic inputs: rounding happens, so only bitwise reproducibility (same GPU, same cuBLAS, same
// alignment class) is expected, which is what the native-vs-shim comparison checks.
std::vector<float> generic_matrix(size_t n, uint32_t seed) {
  std::vector<float> m(n);
  for (size_t i = 0; i < n; ++i)
    m[i] = static_cast<float>(mix32(static_cast<uint32_t>(i) * 2654435761U + seed)) / 4294967296.0f - 0.5f;
  return m;
}

// FNV-1a over the raw bytes: any bit difference shows.
uint64_t fnv1a(const std::vector<float>& v) {
  uint64_t h = 0xcbf29ce484222325ULL;
  const auto* bytes = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) {
    h ^= bytes[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

uint64_t double_bits(double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof(bits));
  return bits;
}

float* device_copy(const std::vector<float>& host, const char* what) {
  float* d = nullptr;
  VMMCKPT_CHECK(cudaMalloc(&d, host.size() * sizeof(float)));
  gpu_check::print_ptr(d, host.size() * sizeof(float), what);
  VMMCKPT_CHECK(cudaMemcpy(d, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  return d;
}

std::vector<float> host_copy(const float* d, size_t n) {
  std::vector<float> host(n);
  VMMCKPT_CHECK(cudaMemcpy(host.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
  return host;
}

void report(const std::string& name, const std::vector<float>& c) {
  double sum = 0;  // fixed order on the host: reproducible
  for (float x : c) sum += x;
  gpu_check::print_result((name + ".fnv1a").c_str(), fnv1a(c));
  gpu_check::print_result((name + ".sum_bits").c_str(), double_bits(sum));
  std::printf("info %s sum %.17g\n", name.c_str(), sum);
}

int failures = 0;

}  // namespace

int main(int argc, char** argv) {
  const int device = gpu_check::device_option(argc, argv);
  VMMCKPT_CHECK(cudaSetDevice(device));

  cudaStream_t stream;
  VMMCKPT_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t handle;
  VMMCKPT_CHECK(cublasCreate(&handle));
  VMMCKPT_CHECK(cublasSetStream(handle, stream));
  // Pedantic math: no TF32 or other reduced-precision shortcuts.
  VMMCKPT_CHECK(cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH));
  // Our own workspace: its address is printed and checked too, and cuBLAS picks the same
  // algorithms in both runs because the workspace size is fixed.
  const size_t workspace_size = 32 * 1024 * 1024;
  void* workspace = nullptr;
  VMMCKPT_CHECK(cudaMalloc(&workspace, workspace_size));
  gpu_check::print_ptr(workspace, workspace_size, "cudaMalloc");
  VMMCKPT_CHECK(cublasSetWorkspace(handle, workspace, workspace_size));

  // GEMM 1: exact inputs, cublasSgemm, checked bit for bit against a host reference.
  {
    const int m = 1024, n = 768, k = 2048;  // column-major: A m x k, B k x n, C m x n
    std::vector<float> a = exact_matrix(size_t{m} * k, 1), b = exact_matrix(size_t{k} * n, 2);
    float* da = device_copy(a, "cudaMalloc");
    float* db = device_copy(b, "cudaMalloc");
    float* dc = device_copy(std::vector<float>(size_t{m} * n, 0.0f), "cudaMalloc");
    const float alpha = 1.0f, beta = 0.0f;
    VMMCKPT_CHECK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, da, m, db, k, &beta, dc, m));
    VMMCKPT_CHECK(cudaStreamSynchronize(stream));
    std::vector<float> c = host_copy(dc, size_t{m} * n);
    // Reference on a sample of entries (every 97th): enough to catch wrong data, cheap on a CPU.
    size_t mismatches = 0;
    for (size_t idx = 0; idx < c.size(); idx += 97) {
      size_t row = idx % m, col = idx / m;
      float ref = 0.0f;
      for (int p = 0; p < k; ++p) ref += a[row + static_cast<size_t>(p) * m] * b[p + col * size_t{k}];
      mismatches += (ref != c[idx]);
    }
    if (mismatches != 0) {
      std::fprintf(stderr, "CHECK FAILED: sgemm_exact: %zu sampled entries differ from the host\n", mismatches);
      ++failures;
    }
    report("sgemm_exact", c);
    VMMCKPT_CHECK(cudaFree(da));
    VMMCKPT_CHECK(cudaFree(db));
    VMMCKPT_CHECK(cudaFree(dc));
  }

  // GEMM 2: generic inputs, odd shapes, transposed A, beta != 0, through cublasGemmEx.
  {
    const int m = 1000, n = 777, k = 513;
    std::vector<float> a = generic_matrix(size_t{k} * m, 3);  // stored k x m, used transposed
    std::vector<float> b = generic_matrix(size_t{k} * n, 4);
    std::vector<float> c0 = generic_matrix(size_t{m} * n, 5);
    float* da = device_copy(a, "cudaMalloc");
    float* db = device_copy(b, "cudaMalloc");
    float* dc = device_copy(c0, "cudaMalloc");
    const float alpha = 0.75f, beta = -0.5f;
    VMMCKPT_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, da, CUDA_R_32F, k, db, CUDA_R_32F, k,
                               &beta, dc, CUDA_R_32F, m, CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT));
    VMMCKPT_CHECK(cudaStreamSynchronize(stream));
    std::vector<float> c = host_copy(dc, size_t{m} * n);
    // Tolerance check against a double reference on a sample: proves the product is right.
    size_t bad = 0;
    for (size_t idx = 0; idx < c.size(); idx += 101) {
      size_t row = idx % m, col = idx / m;
      double ref = 0;
      for (int p = 0; p < k; ++p) ref += double(a[p + row * size_t{k}]) * double(b[p + col * size_t{k}]);
      ref = alpha * ref + beta * double(c0[idx]);
      bad += std::fabs(ref - c[idx]) > 1e-3;
    }
    if (bad != 0) {
      std::fprintf(stderr, "CHECK FAILED: gemmex_generic: %zu sampled entries off by > 1e-3\n", bad);
      ++failures;
    }
    report("gemmex_generic", c);
    VMMCKPT_CHECK(cudaFree(da));
    VMMCKPT_CHECK(cudaFree(db));
    VMMCKPT_CHECK(cudaFree(dc));
  }

  // GEMM 3: strided batched, so cuBLAS walks pointer offsets across one large allocation.
  {
    const int m = 256, n = 256, k = 256, batch = 64;
    const long long stride = static_cast<long long>(m) * k;
    std::vector<float> a = generic_matrix(size_t(stride) * batch, 6);
    std::vector<float> b = generic_matrix(size_t(stride) * batch, 7);
    float* da = device_copy(a, "cudaMalloc");
    float* db = device_copy(b, "cudaMalloc");
    float* dc = device_copy(std::vector<float>(size_t(stride) * batch, 0.0f), "cudaMalloc");
    const float alpha = 1.0f, beta = 0.0f;
    VMMCKPT_CHECK(cublasSgemmStridedBatched(handle, CUBLAS_OP_N, CUBLAS_OP_T, m, n, k, &alpha, da, m, stride, db, n,
                                            stride, &beta, dc, m, stride, batch));
    VMMCKPT_CHECK(cudaStreamSynchronize(stream));
    report("sgemm_batched", host_copy(dc, size_t(stride) * batch));
    VMMCKPT_CHECK(cudaFree(da));
    VMMCKPT_CHECK(cudaFree(db));
    VMMCKPT_CHECK(cudaFree(dc));
  }

  VMMCKPT_CHECK(cublasDestroy(handle));
  VMMCKPT_CHECK(cudaFree(workspace));
  VMMCKPT_CHECK(cudaStreamDestroy(stream));
  if (failures != 0) {
    std::fprintf(stderr, "cublas_gemm: %d check(s) failed\n", failures);
    return 1;
  }
  std::printf("info cublas_gemm done\n");
  return 0;
}
