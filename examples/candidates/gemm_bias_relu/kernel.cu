// Epilogue of relu(x @ W^T + b): add the bias of each column and clamp at zero, in place.
extern "C" __global__ void bias_relu(float* __restrict__ y, const float* __restrict__ b,
                                     long long n, int cols) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        y[i] = fmaxf(y[i] + b[i % cols], 0.0f);
    }
}
