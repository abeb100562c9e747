// Convolution helpers: im2col / col2im and the bias add / bias gradient.
// NumPy twins: ibtmpi/ops/conv.py im2col, col2im (reference), conv2d_forward's
// bias add on the (F, N*Ho*Wo) GEMM output, conv2d_backward's db.
// The GEMMs themselves go through cuBLAS (cupy.matmul).
// All loops are grid-stride, so any launch geometry is correct.

// x (N, C, H, W) contiguous, or with cnhw the (C, N, H, W) buffer a conv,
// batchnorm or residual block writes (read where it lies, no transpose
// copy) -> col (C*kh*kw, N*Ho*Wo).
// Flat index idx = row * M + m with M = N*Ho*Wo,
//   row = (c*kh + i)*kw + j,  m = (n*Ho + ho)*Wo + wo,
//   col = x[n, c, ho*stride + i - pad, wo*stride + j - pad] (0 in the padding).
extern "C" __global__ void im2col(const float* __restrict__ x, float* __restrict__ col,
                                  int N, int C, int H, int W, int kh, int kw,
                                  int stride, int pad, int Ho, int Wo, int cnhw)
{
    const long long M = (long long)N * Ho * Wo;
    const long long total = (long long)C * kh * kw * M;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)blockDim.x * gridDim.x) {
        const long long row = idx / M, m = idx % M;
        const int j = (int)(row % kw);
        const int i = (int)((row / kw) % kh);
        const int c = (int)(row / ((long long)kw * kh));
        const int wo = (int)(m % Wo);
        const int ho = (int)((m / Wo) % Ho);
        const int n = (int)(m / ((long long)Wo * Ho));
        const int h = ho * stride + i - pad, w = wo * stride + j - pad;
        const long long plane = cnhw ? (long long)c * N + n : (long long)n * C + c;
        col[idx] = (h >= 0 && h < H && w >= 0 && w < W)
                       ? x[(plane * H + h) * W + w] : 0.0f;
    }
}

// Adjoint of im2col, as a gather (no atomics, deterministic): each thread
// owns one dx[n, c, h, w] (N, C, H, W) and sums the col entries that
// im2col copied from it: kernel offsets (i, j) with h + pad - i = ho*stride
// for an integer 0 <= ho < Ho (and likewise for w).
extern "C" __global__ void col2im(const float* __restrict__ col, float* __restrict__ dx,
                                  int N, int C, int H, int W, int kh, int kw,
                                  int stride, int pad, int Ho, int Wo)
{
    const long long M = (long long)N * Ho * Wo;
    const long long total = (long long)N * C * H * W;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)blockDim.x * gridDim.x) {
        const int w = (int)(idx % W);
        const int h = (int)((idx / W) % H);
        const int c = (int)((idx / ((long long)W * H)) % C);
        const int n = (int)(idx / ((long long)W * H * C));
        float acc = 0.0f;
        for (int i = 0; i < kh; ++i) {
            const int hp = h + pad - i;
            if (hp < 0 || hp % stride) continue;
            const int ho = hp / stride;
            if (ho >= Ho) continue;
            for (int j = 0; j < kw; ++j) {
                const int wp = w + pad - j;
                if (wp < 0 || wp % stride) continue;
                const int wo = wp / stride;
                if (wo >= Wo) continue;
                const long long row = ((long long)c * kh + i) * kw + j;
                acc += col[row * M + ((long long)n * Ho + ho) * Wo + wo];
            }
        }
        dx[idx] = acc;
    }
}

// y (F, M) += b[f]: the conv GEMM output, one bias per row.
extern "C" __global__ void bias_add_rows(float* __restrict__ y, const float* __restrict__ b,
                                         int F, long long M)
{
    const long long total = (long long)F * M;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)blockDim.x * gridDim.x)
        y[idx] += b[idx / M];
}

// y (N, O) += b[o]: the linear layer's output, one bias per column.
extern "C" __global__ void bias_add_cols(float* __restrict__ y, const float* __restrict__ b,
                                         int N, int O)
{
    const long long total = (long long)N * O;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)blockDim.x * gridDim.x)
        y[idx] += b[idx % O];
}

// Row sums without atomics, in passes: for x (F, M) and out (F, P),
//   out[f * P + p] = sum of x[f * M + m] over m = p, p + P, p + 2P, ... < M,
// added in increasing m. Thread idx = f * P + p; consecutive threads take
// consecutive p, so a warp reads consecutive addresses. The launcher
// (backend.GpuOps.bias_grad_rows, widths from ops.row_sum_widths) repeats
// it with P = ceil(M / 64) until P = 1: each thread adds at most 64 terms
// and the order of every addition depends on the shape alone, so the conv
// bias gradient is bitwise the same from run to run (atomicAdd is not).
// NumPy twin: ops.row_partial_sums.
extern "C" __global__ void row_partial_sums(const float* __restrict__ x,
                                            float* __restrict__ out, int F, long long M,
                                            int P)
{
    const long long total = (long long)F * P;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)blockDim.x * gridDim.x) {
        const long long f = idx / P;
        const float* row = x + f * M;
        float acc = 0.0f;
        for (long long m = idx - f * P; m < M; m += P)
            acc += row[m];
        out[idx] = acc;
    }
}

// db[o] = sum_n dy[n, o] for dy (N, O): one thread per column (N is a batch).
extern "C" __global__ void bias_grad_cols(const float* __restrict__ dy, float* __restrict__ db,
                                          int N, int O)
{
    for (int o = blockIdx.x * blockDim.x + threadIdx.x; o < O; o += blockDim.x * gridDim.x) {
        float acc = 0.0f;
        for (int n = 0; n < N; ++n) acc += dy[(long long)n * O + o];
        db[o] = acc;
    }
}
