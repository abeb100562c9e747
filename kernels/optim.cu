// Fused local optimizer steps over the flat parameter vector, one launch each.
// NumPy twins: ibtmpi/optim/sgd.py sgd_update, ibtmpi/optim/adam.py adam_update
// (the SGD and Adam classes with the ADMM prox hook compute the same things;
// tests/unit/test_kernels.py checks both).
//
// sgd_update:
//   g' = g + wd*w + (has_prox ? rho*(w - c + u) : 0)
//   v  = mu*v + g'
//   w -= lr * (nesterov ? g' + mu*v : v)
// c (prox centre) and u (scaled dual) are read only when has_prox.
extern "C" __global__ void sgd_update(float* __restrict__ w, const float* __restrict__ g,
                                      float* __restrict__ v, const float* __restrict__ c,
                                      const float* __restrict__ u, long long n,
                                      float lr, float mu, float wd, float rho,
                                      int nesterov, int has_prox)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x) {
        const float wi = w[i];
        float gi = g[i] + wd * wi;
        if (has_prox) gi += rho * ((wi - c[i]) + u[i]);
        const float vi = mu * v[i] + gi;
        v[i] = vi;
        w[i] = wi - lr * (nesterov ? gi + mu * vi : vi);
    }
}

// adam_update (Adam / AdamW in PyTorch's order; the host forms the scalars in
// float64: omb1 = 1-b1, omb2 = 1-b2, step = lr/bc1, bc2s = sqrt(bc2),
// decay = 1-lr*wd, with bc1 = 1-b1^t, bc2 = 1-b2^t of the new step count t):
//   g' = g + (decoupled ? 0 : wd*w) + (has_prox ? rho*(w - c + u) : 0)
//   w  = decoupled ? w*decay : w          (AdamW; g' was taken at w before it)
//   m  = b1*m + omb1*g';  v = b2*v + omb2*g'*g'
//   w -= step * (m / (sqrt(v)/bc2s + eps))
// c (prox centre) and u (scaled dual) are read only when has_prox.
extern "C" __global__ void adam_update(float* __restrict__ w, const float* __restrict__ g,
                                       float* __restrict__ m, float* __restrict__ v,
                                       const float* __restrict__ c,
                                       const float* __restrict__ u, long long n,
                                       float b1, float omb1, float b2, float omb2,
                                       float step, float bc2s, float eps, float wd,
                                       float decay, float rho, int decoupled, int has_prox)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x) {
        float wi = w[i];
        float gi = g[i];
        if (!decoupled) gi += wd * wi;
        if (has_prox) gi += rho * ((wi - c[i]) + u[i]);
        if (decoupled) wi *= decay;
        const float mi = b1 * m[i] + omb1 * gi;
        const float vi = b2 * v[i] + omb2 * (gi * gi);
        m[i] = mi;
        v[i] = vi;
        w[i] = wi - step * (mi / (sqrtf(vi) / bc2s + eps));
    }
}
