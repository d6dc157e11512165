// relu(x + bias) over a row-major [rows, features] tensor, four elements per thread (float4).
extern "C" __global__ void add_relu4(const float4* __restrict__ x, const float4* __restrict__ bias,
                                     float4* __restrict__ out, long long n4, int features4) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 v = x[i];
        float4 b = bias[i % features4];
        v.x = fmaxf(v.x + b.x, 0.0f);
        v.y = fmaxf(v.y + b.y, 0.0f);
        v.z = fmaxf(v.z + b.z, 0.0f);
        v.w = fmaxf(v.w + b.w, 0.0f);
        out[i] = v;
    }
}
