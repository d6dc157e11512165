// relu(x @ W^T + b) with cuBLAS SGEMM (true FP32) on the caller's stream, then the epilogue.
#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" void launch_bias_relu(float* y, const float* b, long long n, int cols,
                                 cudaStream_t stream);

static cublasHandle_t handle = nullptr;

extern "C" int gemm_bias_relu(const float* x, const float* w, const float* b, float* y, int rows,
                              int cols, int inner, void* stream) {
    if (handle == nullptr) {
        cublasStatus_t st = cublasCreate(&handle);
        if (st != CUBLAS_STATUS_SUCCESS) return 1000 + (int)st;
        cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH);
    }
    cudaStream_t s = (cudaStream_t)stream;
    cublasSetStream(handle, s);
    const float one = 1.0f, zero = 0.0f;
    // Row-major y[rows, cols] = x[rows, inner] . W[cols, inner]^T is column-major
    // y^T[cols, rows] = W^T^T . x^T: op(A) = W (stored as W^T, lda = inner), B = x^T.
    cublasStatus_t st = cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, cols, rows, inner, &one, w,
                                    inner, x, inner, &zero, y, cols);
    if (st != CUBLAS_STATUS_SUCCESS) return 2000 + (int)st;
    launch_bias_relu(y, b, (long long)rows * cols, cols, s);
    return (int)cudaGetLastError();
}
