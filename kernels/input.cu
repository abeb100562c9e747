// Input normalisation on the device: a worker's minibatch comes up as uint8
// (N, H, W, C) images, a quarter of the bytes of the float32 (N, C, H, W)
// tensor the model takes, and becomes that tensor here:
//   y[n, c, h, w] = float(x[n, h, w, c]) * scale[c] + shift[c]
// with scale = 1/std and shift = -mean/std (float32, from the data set's
// statistics). NumPy twin: ibtmpi/data.py normalize, bit for bit: the
// multiply and the add are rounded separately (__fmul_rn, __fadd_rn: no
// fused multiply-add), as NumPy's two passes are.
extern "C" __global__ void normalize_u8(const unsigned char* __restrict__ x,
                                        float* __restrict__ y,
                                        const float* __restrict__ scale,
                                        const float* __restrict__ shift, int N, int H,
                                        int W, int C)
{
    const long long total = (long long)N * C * H * W;
    const long long hw = (long long)H * W;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)blockDim.x * gridDim.x) {
        const long long n = i / (C * hw);
        const long long r = i - n * C * hw;
        const int c = (int)(r / hw);
        const long long p = r - (long long)c * hw;          // h * W + w
        const float v = (float)x[(n * hw + p) * C + c];
        y[i] = __fadd_rn(__fmul_rn(v, scale[c]), shift[c]);
    }
}
