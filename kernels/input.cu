// Input normalisation on the device: a worker's minibatch comes up as uint8
// (N, H, W, C) images, a quarter of the bytes of the float32 (N, C, H, W)
// tensor the model takes (uint16 for a set of 16-bit bands: half), and
// becomes that tensor here:
//   y[n, c, h, w] = float(x[n, h, w, c]) * scale[c] + shift[c]
// with scale = 1/std and shift = -mean/std (float32, from the data set's
// statistics). NumPy twin: ibtmpi/data.py normalize, bit for bit: the
// multiply and the add are rounded separately (__fmul_rn, __fadd_rn: no
// fused multiply-add), as NumPy's two passes are.

// One output element t of the (N, C, H, W) tensor; id: image n's
// transform (0: none). T: the stored pixel type (uint8 or uint16; both
// convert to float32 exactly).
template <typename T>
__device__ __forceinline__ float normalize_one(const T* __restrict__ x,
                                               const float* __restrict__ scale,
                                               const float* __restrict__ shift,
                                               long long t, int id, int H, int W, int C)
{
    const long long hw = (long long)H * W;
    const long long n = t / (C * hw);
    const long long r = t - n * C * hw;
    const int c = (int)(r / hw);
    const long long p = r - (long long)c * hw;           // i * W + j
    const int i = (int)(p / W);
    int j = (int)(p - (long long)i * W);
    if (id >= 4)
        j = W - 1 - j;
    const int k = (H == W) ? (id & 3) : 0;
    int si = i, sj = j;
    if (k == 1) {
        si = j;
        sj = W - 1 - i;
    } else if (k == 2) {
        si = H - 1 - i;
        sj = W - 1 - j;
    } else if (k == 3) {
        si = H - 1 - j;
        sj = i;
    }
    const float v = (float)x[((n * H + si) * W + sj) * C + c];
    return __fadd_rn(__fmul_rn(v, scale[c]), shift[c]);
}

// The grid-stride loop over the (N, C, H, W) output; ids: each image's
// transform, or null (none).
template <typename T>
__device__ __forceinline__ void normalize_all(const T* __restrict__ x, float* __restrict__ y,
                                              const float* __restrict__ scale,
                                              const float* __restrict__ shift,
                                              const int* __restrict__ ids, int N, int H,
                                              int W, int C)
{
    const long long total = (long long)N * C * H * W;
    const long long chw = (long long)C * H * W;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (long long)blockDim.x * gridDim.x)
        y[t] = normalize_one(x, scale, shift, t, ids ? ids[t / chw] : 0, H, W, C);
}

extern "C" __global__ void normalize_u8(const unsigned char* __restrict__ x,
                                        float* __restrict__ y,
                                        const float* __restrict__ scale,
                                        const float* __restrict__ shift, int N, int H,
                                        int W, int C)
{
    normalize_all(x, y, scale, shift, (const int*)0, N, H, W, C);
}

// The same with the training augmentation folded in: image n is first
// transformed by ids[n] in 0..7 (ibtmpi/loader.py dihedral: rotate by
// 90 * (id % 4) degrees, square images only, then flip left-right if
// id >= 4), so the host uploads the raw images and never rewrites them.
// Each output pixel (i, j) reads the source pixel the transform puts
// there: with the flip, j -> W - 1 - j first; then the rotation's inverse
// (NumPy's rot90 counter-clockwise: k = 1 reads (j, W-1-i), k = 2
// (H-1-i, W-1-j), k = 3 (H-1-j, i)).
extern "C" __global__ void normalize_u8_aug(const unsigned char* __restrict__ x,
                                            float* __restrict__ y,
                                            const float* __restrict__ scale,
                                            const float* __restrict__ shift,
                                            const int* __restrict__ ids, int N, int H,
                                            int W, int C)
{
    normalize_all(x, y, scale, shift, ids, N, H, W, C);
}

// The same two for uint16 images (prep folder keeps 16-bit bands as they are).
extern "C" __global__ void normalize_u16(const unsigned short* __restrict__ x,
                                         float* __restrict__ y,
                                         const float* __restrict__ scale,
                                         const float* __restrict__ shift, int N, int H,
                                         int W, int C)
{
    normalize_all(x, y, scale, shift, (const int*)0, N, H, W, C);
}

extern "C" __global__ void normalize_u16_aug(const unsigned short* __restrict__ x,
                                             float* __restrict__ y,
                                             const float* __restrict__ scale,
                                             const float* __restrict__ shift,
                                             const int* __restrict__ ids, int N, int H,
                                             int W, int C)
{
    normalize_all(x, y, scale, shift, ids, N, H, W, C);
}
