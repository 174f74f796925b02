// Self-test kernel for the launcher infrastructure (edgesdk/kernels/_cuda.py): y = a*x + y.
// Also an FFMA-bound loop to check SM-limited green contexts.
extern "C" __global__ void edgesdk_axpy(float* __restrict__ y, const float* __restrict__ x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

extern "C" __global__ void edgesdk_ffma_spin(float* __restrict__ o, float a, float b, int iters) {
  float x = threadIdx.x, y = x + 1, z = x + 2, w = x + 3;
  for (int i = 0; i < iters; i++) { x = fmaf(x, a, b); y = fmaf(y, a, b); z = fmaf(z, a, b); w = fmaf(w, a, b); }
  o[blockIdx.x * blockDim.x + threadIdx.x] = x + y + z + w;
}
