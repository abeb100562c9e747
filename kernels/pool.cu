// Max-pool over k x k windows with stride s, no padding.
// NumPy twins: ibtmpi/ops/pool.py maxpool_forward / maxpool_backward.
// pad: cells of padding around x that never win a window (torchvision's
// stem pool: k 3, stride 2, pad 1); argmax counts offsets in the padded
// window, as the twin's.
// y, dy and argmax (N, C, Ho, Wo) are NCHW contiguous; x (forward) and dx
// (backward) are NCHW contiguous when cnhw == 0, and physically (C, N, H, W)
// when cnhw == 1: the layout a conv's GEMM produces and its backward GEMM
// reads, so a conv -> pool pair needs no transpose copy either way.
// argmax (N, C, Ho, Wo) uint8 = window offset i*k + j of the FIRST maximum
// in row-major scan order (strict '>': ties go to the lowest offset).
// Fused on the GPU for conv -> pool -> relu (the model's order, see
// layers/fuse.py commute_relu_pool): with has_bias, x is the conv's GEMM output
// WITHOUT its bias and the forward adds bias[c] to each value it compares
// (the values, maxima and argmax of pooling the biased output); with relu
// the forward outputs relu(max) and the backward passes dy only where that
// output y is > 0. Bit for bit bias_add_rows -> maxpool -> relu_fwd and
// relu_bwd -> maxpool_bwd, in 2 launches instead of 5, and the conv output
// (the largest tensor of the step) is read once instead of three times.

// offset of plane (n, c) of an (N, C, H, W) tensor, H*W elements per plane
__device__ __forceinline__ long long plane_offset(long long n, long long c, int N, int C,
                                                  long long hw, int cnhw)
{
    return (cnhw ? c * N + n : n * C + c) * hw;
}

// Output idx (over y, NCHW) of a k x k / stride pool: sets nc = n*C + c and
// returns the first element of its window in x (NCHW, or (C, N, H, W)).
__device__ __forceinline__ const float* window_start(const float* x, long long idx, int N,
                                                     int C, int H, int W, int stride,
                                                     int Ho, int Wo, int cnhw, long long& nc)
{
    const int wo = (int)(idx % Wo);
    const int ho = (int)((idx / Wo) % Ho);
    nc = idx / ((long long)Wo * Ho);
    return x + plane_offset(nc / C, nc % C, N, C, (long long)H * W, cnhw)
           + (long long)(ho * stride) * W + wo * stride;
}

// Input cell idx of a pool's dx, in dx's physical order (NCHW, or (C, N, H, W)
// with cnhw): its plane nc = n*C + c, its (h, w), and the windows (ho, wo)
// that contain it: ho*stride <= h < ho*stride + k, i.e. ho in
// [ceil((h-k+1)/s), floor(h/s)] within [0, Ho), the same for wo.
struct PoolCell { long long nc; int h, w, ho_lo, ho_hi, wo_lo, wo_hi; };

__device__ __forceinline__ PoolCell pool_cell(long long idx, int N, int C, int H, int W,
                                              int k, int stride, int Ho, int Wo, int cnhw)
{
    PoolCell p;
    p.w = (int)(idx % W);
    p.h = (int)((idx / W) % H);
    const long long plane = idx / ((long long)W * H);    // c*N + n, or n*C + c
    p.nc = cnhw ? (plane % N) * C + plane / N : plane;
    p.ho_lo = p.h - k + 1 > 0 ? (p.h - k + 1 + stride - 1) / stride : 0;
    p.wo_lo = p.w - k + 1 > 0 ? (p.w - k + 1 + stride - 1) / stride : 0;
    p.ho_hi = min(p.h / stride, Ho - 1);
    p.wo_hi = min(p.w / stride, Wo - 1);
    return p;
}

extern "C" __global__ void maxpool_fwd(const float* __restrict__ x, float* __restrict__ y,
                                       unsigned char* __restrict__ argmax,
                                       const float* __restrict__ bias,
                                       int N, int C, int H, int W, int k, int stride,
                                       int Ho, int Wo, int cnhw, int has_bias, int relu,
                                       int pad)
{
    const long long total = (long long)N * C * Ho * Wo;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)blockDim.x * gridDim.x) {           // idx over y: NCHW
        const int wo = (int)(idx % Wo);
        const int ho = (int)((idx / Wo) % Ho);
        const long long nc = idx / ((long long)Wo * Ho);
        const float* plane = x + plane_offset(nc / C, nc % C, N, C, (long long)H * W, cnhw);
        const int h0 = ho * stride - pad, w0 = wo * stride - pad;   // the padded window
        const float b = has_bias ? bias[nc % C] : 0.0f;
        float best = 0.0f;
        int arg = -1;              // the first real cell starts the scan: padding never wins
        for (int i = 0; i < k; ++i) {
            const int h = h0 + i;
            if (h < 0 || h >= H) continue;
            for (int j = 0; j < k; ++j) {
                const int w = w0 + j;
                if (w < 0 || w >= W) continue;
                float v = plane[(long long)h * W + w];
                if (has_bias) v += b;
                if (arg < 0 || v > best) { best = v; arg = i * k + j; }
            }
        }
        y[idx] = relu ? (best > 0.0f ? best : 0.0f) : best;
        argmax[idx] = (unsigned char)arg;
    }
}

// Gather form (deterministic, no atomics): dx[n, c, h, w] sums dy over the
// windows (ho, wo) that contain (h, w) (pool_cell) and whose argmax points
// at it. Threads walk dx in its physical order (coalesced writes in both
// layouts).
extern "C" __global__ void maxpool_bwd(const float* __restrict__ dy,
                                       const unsigned char* __restrict__ argmax,
                                       float* __restrict__ dx,
                                       const float* __restrict__ y,
                                       int N, int C, int H, int W, int k, int stride,
                                       int Ho, int Wo, int cnhw, int relu, int pad)
{
    const long long total = (long long)N * C * H * W;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)blockDim.x * gridDim.x) {
        // the cell in the padded frame (H + 2 pad, W + 2 pad), whose windows
        // are those of an unpadded pool over it
        PoolCell p = pool_cell(idx, N, C, H, W, k, stride, Ho, Wo, cnhw);
        if (pad) {
            const int hp = p.h + pad, wp = p.w + pad;
            p.ho_lo = hp - k + 1 > 0 ? (hp - k + 1 + stride - 1) / stride : 0;
            p.wo_lo = wp - k + 1 > 0 ? (wp - k + 1 + stride - 1) / stride : 0;
            p.ho_hi = min(hp / stride, Ho - 1);
            p.wo_hi = min(wp / stride, Wo - 1);
            p.h = hp;
            p.w = wp;
        }
        float acc = 0.0f;
        for (int ho = p.ho_lo; ho <= p.ho_hi; ++ho)
            for (int wo = p.wo_lo; wo <= p.wo_hi; ++wo) {
                const long long o = (p.nc * Ho + ho) * Wo + wo;
                if (argmax[o] == (p.h - ho * stride) * k + (p.w - wo * stride))
                    acc += relu ? (y[o] > 0.0f ? dy[o] : 0.0f) : dy[o];
            }
        dx[idx] = acc;
    }
}

// Average pool over k x k windows with stride s, no padding.
// NumPy twins: ibtmpi/ops/pool.py avgpool_forward / avgpool_backward.
// y, dy (N, C, Ho, Wo) are NCHW contiguous; x (forward) and dx (backward)
// are NCHW contiguous when cnhw == 0 and physically (C, N, H, W) when
// cnhw == 1 (a conv's output and its backward's input, as for maxpool).
// y = (the window summed in row-major order from 0) * (1 / (k*k)): the
// twin's order, so the same bits.
extern "C" __global__ void avgpool_fwd(const float* __restrict__ x, float* __restrict__ y,
                                       int N, int C, int H, int W, int k, int stride,
                                       int Ho, int Wo, int cnhw)
{
    const long long total = (long long)N * C * Ho * Wo;
    const float inv = 1.0f / (float)(k * k);
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)blockDim.x * gridDim.x) {           // idx over y: NCHW
        long long nc;
        const float* base = window_start(x, idx, N, C, H, W, stride, Ho, Wo, cnhw, nc);
        float acc = 0.0f;
        for (int i = 0; i < k; ++i)
            for (int j = 0; j < k; ++j) acc += base[(long long)i * W + j];
        y[idx] = acc * inv;
    }
}

// Gather form (deterministic, no atomics; overlapping windows, stride < k,
// need nothing else): dx[n, c, h, w] = (sum of dy over the windows (ho, wo)
// that contain (h, w)) * (1 / (k*k)), 0 where none does. The windows come
// in the twin's slice-add order, offset (h - ho*s, w - wo*s) row-major, i.e.
// ho then wo DESCENDING. Threads walk dx in its physical order.
extern "C" __global__ void avgpool_bwd(const float* __restrict__ dy, float* __restrict__ dx,
                                       int N, int C, int H, int W, int k, int stride,
                                       int Ho, int Wo, int cnhw)
{
    const long long total = (long long)N * C * H * W;
    const float inv = 1.0f / (float)(k * k);
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)blockDim.x * gridDim.x) {
        const PoolCell p = pool_cell(idx, N, C, H, W, k, stride, Ho, Wo, cnhw);
        float acc = 0.0f;
        for (int ho = p.ho_hi; ho >= p.ho_lo; --ho)
            for (int wo = p.wo_hi; wo >= p.wo_lo; --wo) acc += dy[(p.nc * Ho + ho) * Wo + wo];
        dx[idx] = acc * inv;
    }
}

// Global average pooling. NumPy twins: ops.gap_forward / ops.gap_backward.
// y[n, c] = (sum over the H*W positions in order) * (1 / HW); x NCHW or,
// with cnhw, the (C, N, H, W) buffer a conv writes. One thread per (n, c).
extern "C" __global__ void gap_fwd(const float* __restrict__ x, float* __restrict__ y, int N,
                                   int C, long long HW, int cnhw)
{
    const long long total = (long long)N * C;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)blockDim.x * gridDim.x) {
        const long long n = i / C, c = i - n * C;
        const float* p = x + (cnhw ? (c * N + n) * HW : i * HW);
        float acc = 0.0f;
        for (long long j = 0; j < HW; ++j) acc += p[j];
        y[i] = acc * (1.0f / (float)HW);
    }
}

// dx[n, c, :, :] = dy[n, c] / HW, dx NCHW.
extern "C" __global__ void gap_bwd(const float* __restrict__ dy, float* __restrict__ dx,
                                   long long NC, long long HW)
{
    const long long total = NC * HW;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)blockDim.x * gridDim.x)
        dx[i] = dy[i / HW] * (1.0f / (float)HW);
}
