// Consensus vector updates (DESIGN.md section 3), flat vectors of length n.
// NumPy twins: ibtmpi/consensus.py axpby, dual_update, block_momentum.

// out = a*x + b*y (z = scale*S with b = 0; U = S - N*z; EASGD moves).
extern "C" __global__ void axpby(float* out, float a, const float* x, float b,
                                 const float* y, long long n)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x)
        out[i] = a * x[i] + b * y[i];
}

// Scaled dual: u = (u + w_hat - z) * scale  (scale = rho_old / rho_new).
extern "C" __global__ void dual_update(float* __restrict__ u, const float* __restrict__ w_hat,
                                       const float* __restrict__ z, float scale, long long n)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x)
        u[i] = ((u[i] + w_hat[i]) - z[i]) * scale;
}

// Block momentum (BMUF / IBT): G = S/N - zg; v = eta*v + zeta*G;
// z = zg + v; zg = nesterov ? z + eta*v : z.
extern "C" __global__ void block_momentum(const float* __restrict__ S, float* __restrict__ zg,
                                          float* __restrict__ v, float* __restrict__ z,
                                          long long n, float inv_n, float eta, float zeta,
                                          int nesterov)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x) {
        const float G = S[i] * inv_n - zg[i];
        const float vi = eta * v[i] + zeta * G;
        const float zi = zg[i] + vi;
        v[i] = vi;
        z[i] = zi;
        zg[i] = nesterov ? zi + eta * vi : zi;
    }
}
