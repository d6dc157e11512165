// Sum of each row: one block per row.
#define FULL_MASK 0xffffffffu
#define NEG_BIG (-3.402823466e+38f)

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// Reduce over the block; every thread gets the result. red: 32 floats of shared memory.
__device__ float block_reduce(float v, float* red, bool is_max) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = is_max ? warp_max(v) : warp_sum(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    int warps = (blockDim.x + 31) >> 5;
    v = (threadIdx.x < warps) ? red[threadIdx.x] : (is_max ? NEG_BIG : 0.0f);
    if (warp == 0) v = is_max ? warp_max(v) : warp_sum(v);
    if (threadIdx.x == 0) red[0] = v;
    __syncthreads();
    v = red[0];
    __syncthreads();
    return v;
}

extern "C" __global__ void row_sum(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ float red[32];
    const float* xr = x + (size_t)blockIdx.x * cols;
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += xr[c];
    s = block_reduce(s, red, false);
    if (threadIdx.x == 0) y[blockIdx.x] = s;
}
