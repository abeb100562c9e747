// ReLU. NumPy twins: ibtmpi/ops/activation.py relu_forward / relu_backward.

// y = max(x, 0); y may alias x.
extern "C" __global__ void relu_fwd(const float* x, float* y, long long n)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x)
        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

// dx = dy where y > 0 else 0 (y: the forward output); dx may alias dy.
extern "C" __global__ void relu_bwd(const float* dy, const float* __restrict__ y, float* dx,
                                    long long n)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x)
        dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

// A residual block's end: y = max(a + b, 0) elementwise (a and b in the same
// layout); y may alias a or b. NumPy twin: ops.add_relu_forward; the backward
// is relu_bwd.
extern "C" __global__ void add_relu_fwd(const float* a, const float* b, float* y, long long n)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x) {
        const float s = a[i] + b[i];
        y[i] = s > 0.0f ? s : 0.0f;
    }
}
