// Softmax cross-entropy, numerically stable (shifted by the row max).
// NumPy twins: ibtmpi/ops/softmax_xent.py softmax_xent_forward / softmax_xent_backward
// (softmax_xent_train: both, and argmax(probs) == labels).
// logits, probs, dlogits: (N, K) row-major; labels: (N,) int64.

// One thread per row: probs = softmax(logits[n]), nll[n] = -log probs[n, y].
// The mean loss is sum(nll) / N, reduced by the caller.
extern "C" __global__ void softmax_xent_fwd(const float* __restrict__ logits,
                                            const long long* __restrict__ labels,
                                            float* __restrict__ probs, float* __restrict__ nll,
                                            int N, int K)
{
    for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < N; n += blockDim.x * gridDim.x) {
        const float* z = logits + (long long)n * K;
        float* p = probs + (long long)n * K;
        float m = z[0];
        for (int k = 1; k < K; ++k) m = fmaxf(m, z[k]);
        float s = 0.0f;
        for (int k = 0; k < K; ++k) { p[k] = expf(z[k] - m); s += p[k]; }
        const float inv = 1.0f / s;
        for (int k = 0; k < K; ++k) p[k] *= inv;
        nll[n] = logf(s) - (z[labels[n]] - m);
    }
}

// dlogits[n, k] = (probs[n, k] - [k == labels[n]]) / N.
extern "C" __global__ void softmax_xent_bwd(const float* __restrict__ probs,
                                            const long long* __restrict__ labels,
                                            float* __restrict__ dlogits, int N, int K)
{
    const long long total = (long long)N * K;
    const float invn = 1.0f / (float)N;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)blockDim.x * gridDim.x) {
        const int k = (int)(idx % K);
        const long long n = idx / K;
        dlogits[idx] = (probs[idx] - (labels[n] == k ? 1.0f : 0.0f)) * invn;
    }
}

// A training step's loss end in one launch, one thread per row: dlogits as
// softmax_xent_fwd then softmax_xent_bwd give them (the same float
// operations, so bitwise equal), and the row's loss -log p[y] and hit
// (argmax of p == y, the first maximum winning as in NumPy) ADDED in
// float64 to acc[n] and acc[cap + n], acc being (2, cap) with N <= cap.
// Each row slot sums its own steps in step order (deterministic, no
// atomics): a worker reads its block's loss and correct count with one
// reduction at the block's end, and no step waits for the host.
extern "C" __global__ void softmax_xent_train(const float* __restrict__ logits,
                                              const long long* __restrict__ labels,
                                              float* __restrict__ dlogits,
                                              double* __restrict__ acc, int N, int K, int cap)
{
    const float invn = 1.0f / (float)N;
    for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < N; n += blockDim.x * gridDim.x) {
        const float* z = logits + (long long)n * K;
        float* d = dlogits + (long long)n * K;          // holds p until the last loop
        float m = z[0];
        for (int k = 1; k < K; ++k) m = fmaxf(m, z[k]);
        float s = 0.0f;
        for (int k = 0; k < K; ++k) { d[k] = expf(z[k] - m); s += d[k]; }
        const float inv = 1.0f / s;
        int best = 0;
        for (int k = 0; k < K; ++k) {
            d[k] *= inv;
            if (d[k] > d[best]) best = k;
        }
        const long long y = labels[n];
        const float nll = logf(s) - (z[y] - m);
        for (int k = 0; k < K; ++k) d[k] = (d[k] - (y == k ? 1.0f : 0.0f)) * invn;
        acc[n] += (double)nll;
        acc[(long long)cap + n] += best == y ? 1.0 : 0.0;
    }
}
