// 2-D batch normalisation per channel over M = N*H*W values. NumPy twins:
// ibtmpi/ops/norm.py (batchnorm_forward / batchnorm_backward, and
// bn_partial for one partial-sum pass). No atomics and no shared memory:
// every per-channel sum is bn_partial (P partial sums per channel, each over
// a fixed stride) followed by conv.cu's row_partial_sums passes down to one,
// so the additions come in an order fixed by the shapes and a run repeats
// bit for bit.
// Layouts: an input is either NCHW (cnhw = 0) or the (C, N, H, W) buffer a
// conv writes (cnhw = 1); outputs (xhat, y, dx) are always (C, N, H, W).

__device__ __forceinline__ long long bn_off(long long c, long long m, int C, long long M,
                                            long long HW, int cnhw)
{
    if (cnhw) return c * M + m;
    const long long n = m / HW;
    return (n * C + c) * HW + (m - n * HW);
}

// out[c*P + q] = sum over m = q, q + P, ... (increasing) of
//   mode 0: x[c, m];  mode 1: (x[c, m] - mean[c])^2;  mode 2: x[c, m] * a[c, m]
// (a is (C, N, H, W) in mode 2; mean is read only in mode 1).
extern "C" __global__ void bn_partial(const float* __restrict__ x, const float* __restrict__ a,
                                      const float* __restrict__ mean, float* __restrict__ out,
                                      int C, long long M, long long HW, int P, int cnhw,
                                      int mode)
{
    const long long total = (long long)C * P;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)blockDim.x * gridDim.x) {
        const long long c = idx / P;
        float acc = 0.0f;
        for (long long m = idx - c * P; m < M; m += P) {
            const float v = x[bn_off(c, m, C, M, HW, cnhw)];
            if (mode == 0) acc += v;
            else if (mode == 1) { const float d = v - mean[c]; acc += d * d; }
            else acc += v * a[c * M + m];
        }
        out[idx] = acc;
    }
}

// Per channel, from s1 = sum x and s2 = sum (x - mean)^2 (train), or from
// the running statistics (eval): mean, invstd = 1/sqrt(var + eps); in train
// mode the running statistics move by momentum towards the batch mean and
// the unbiased variance. In train mode mean[c] already holds s1/M (set by
// bn_mean before the squared deviations were summed).
extern "C" __global__ void bn_stats(const float* __restrict__ s2, float* __restrict__ mean,
                                    float* __restrict__ invstd, float* __restrict__ rmean,
                                    float* __restrict__ rvar, int C, long long M,
                                    float momentum, float eps, int train)
{
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += blockDim.x * gridDim.x) {
        if (train) {
            const float var = s2[c] / (float)M;
            invstd[c] = 1.0f / sqrtf(var + eps);
            const float unbiased = M > 1 ? var * (float)((double)M / (double)(M - 1)) : var;
            rmean[c] = rmean[c] * (1.0f - momentum) + momentum * mean[c];
            rvar[c] = rvar[c] * (1.0f - momentum) + momentum * unbiased;
        } else {
            mean[c] = rmean[c];
            invstd[c] = 1.0f / sqrtf(rvar[c] + eps);
        }
    }
}

// mean[c] = s1[c] / M
extern "C" __global__ void bn_mean(const float* __restrict__ s1, float* __restrict__ mean,
                                   int C, long long M)
{
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += blockDim.x * gridDim.x)
        mean[c] = s1[c] / (float)M;
}

// xhat = (x - mean) * invstd; y = gamma * xhat + beta (both (C, N, H, W)).
extern "C" __global__ void bn_apply(const float* __restrict__ x, const float* __restrict__ mean,
                                    const float* __restrict__ invstd,
                                    const float* __restrict__ gamma,
                                    const float* __restrict__ beta, float* __restrict__ xhat,
                                    float* __restrict__ y, int C, long long M, long long HW,
                                    int cnhw)
{
    const long long total = (long long)C * M;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)blockDim.x * gridDim.x) {
        const long long c = i / M;
        const float xh = (x[bn_off(c, i - c * M, C, M, HW, cnhw)] - mean[c]) * invstd[c];
        xhat[i] = xh;
        y[i] = gamma[c] * xh + beta[c];
    }
}

// dx = gamma * invstd / M * (M * dy - dbeta - xhat * dgamma), dx (C, N, H, W);
// dy in either layout.
extern "C" __global__ void bn_bwd_dx(const float* __restrict__ dy, const float* __restrict__ xhat,
                                     const float* __restrict__ dgamma,
                                     const float* __restrict__ dbeta,
                                     const float* __restrict__ gamma,
                                     const float* __restrict__ invstd, float* __restrict__ dx,
                                     int C, long long M, long long HW, int cnhw)
{
    const long long total = (long long)C * M;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)blockDim.x * gridDim.x) {
        const long long c = i / M;
        const float d = dy[bn_off(c, i - c * M, C, M, HW, cnhw)];
        const float k = gamma[c] * invstd[c] / (float)M;
        dx[i] = k * (((float)M * d - dbeta[c]) - xhat[i] * dgamma[c]);
    }
}
