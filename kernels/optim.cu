// Fused local optimizer step over the flat parameter vector.
// NumPy twin: ibtmpi/optim/sgd.py sgd_update (the SGD class with the ADMM prox
// hook computes the same thing; a test checks both).
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
