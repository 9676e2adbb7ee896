// CudaOps lifetime, error recording, workspace and the backend factories.
// The ops themselves live in one .cu per family (matmul_cuda.cu, ...).
#include <cstdio>
#include <memory>
#include <string>

#include "kernels/backends.h"
#include "kernels/cuda/cuda_ops.h"

namespace tandem::kernels {

bool CudaDeviceAvailable() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state
    return false;
  }
  return count > 0;
}

std::unique_ptr<CudaOps> CudaOps::Create() {
  if (!CudaDeviceAvailable()) return nullptr;
  std::unique_ptr<CudaOps> ops(new CudaOps());
  if (cublasCreate(&ops->cublas_) != CUBLAS_STATUS_SUCCESS) {
    ops->cublas_ = nullptr;
    return nullptr;
  }
  // Legacy default stream; exact fp32 unless set_allow_tf32(true).
  cublasSetStream(ops->cublas_, 0);
  cublasSetMathMode(ops->cublas_, CUBLAS_PEDANTIC_MATH);
  cublasSetPointerMode(ops->cublas_, CUBLAS_POINTER_MODE_HOST);
  if (cudaMalloc(&ops->reduce_slot_, sizeof(double)) != cudaSuccess) {
    ops->reduce_slot_ = nullptr;
    return nullptr;
  }
  return ops;
}

CudaOps::~CudaOps() {
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  if (reduce_slot_ != nullptr) cudaFree(reduce_slot_);
  if (workspace_ != nullptr) cudaFree(workspace_);
}

void CudaOps::set_allow_tf32(bool allow) {
  Check(cublasSetMathMode(cublas_, allow ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");
}

bool CudaOps::Check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  if (error_.empty()) {
    error_ = std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
  }
  return false;
}

bool CudaOps::Check(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return true;
  if (error_.empty()) {
    error_ = std::string(what) + ": " + cublasGetStatusName(st) + " (" + cublasGetStatusString(st) + ")";
  }
  return false;
}

void CudaOps::Fail(const char* what, const std::string& why) {
  if (error_.empty()) error_ = std::string(what) + ": " + why;
}

bool CudaOps::Synchronize() {
  Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  Check(cudaGetLastError(), "cudaGetLastError");
  return ok();
}

float* CudaOps::Workspace(size_t floats) {
  if (floats <= workspace_floats_) return workspace_;
  if (workspace_ != nullptr) {
    Check(cudaFree(workspace_), "workspace cudaFree");  // synchronises
    workspace_ = nullptr;
    workspace_floats_ = 0;
  }
  // Grow geometrically so alternating sizes do not reallocate.
  const size_t want = floats + floats / 2 + 1024;
  if (!Check(cudaMalloc(&workspace_, want * sizeof(float)), "workspace cudaMalloc")) {
    workspace_ = nullptr;
    return nullptr;
  }
  workspace_floats_ = want;
  return workspace_;
}

std::unique_ptr<Ops> MakeCudaOps() { return CudaOps::Create(); }

}  // namespace tandem::kernels
