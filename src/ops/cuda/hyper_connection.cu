// Hyper-connection mixes (one projection of the normalized streams, Sinkhorn-projected comb),
// the collapse of the streams into one sublayer input, and the expansion back.
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace deepinfer::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxMixes = 80;  // (2 + hc) * hc for hc <= 8
constexpr int kMaxStreams = 16;

struct MixArgs {
  DeviceRows<const float> x;
  DeviceRows<const float> fn;
  const float* scale;
  const float* base;
  int hc;
  float hc_eps;
  float norm_eps;
  int sinkhorn_iters;
  DeviceRows<float> pre;
  DeviceRows<float> post;
  DeviceRows<float> comb;
};

// Mixes [first, first + count) of row m: the block reduces the row's norm, then each mix's dot
// product, every one in the same thread partition and tree (so any split of the mixes over
// blocks gives the same bits).
__device__ void hc_mix_dots(const MixArgs& args, int64_t m, int first, int count, float* mixes) {
  __shared__ float scratch[32];
  const float* a = args.x.row(m);
  const int64_t cols = args.x.cols;
  float partial = 0.0f;
  for (int64_t d = threadIdx.x; d < cols; d += blockDim.x) partial += a[d] * a[d];
  const float mean_square = deepinfer::cuda::block_sum(partial, scratch) / static_cast<float>(cols);
  const float inv = 1.0f / sqrtf(mean_square + args.norm_eps);
  for (int i = first; i < first + count; ++i) {
    const float* f = args.fn.row(i);
    float dot = 0.0f;
    for (int64_t d = threadIdx.x; d < cols; d += blockDim.x) dot += (a[d] * inv) * f[d];
    const float total = deepinfer::cuda::block_sum(dot, scratch);
    if (threadIdx.x == 0) mixes[i - first] = total;
  }
}

// pre, post and the Sinkhorn-projected comb of row m from its mixes, in the reference's order.
__device__ void hc_mix_finish(const MixArgs& args, int64_t m, const float* mixes) {
  const int hc = args.hc;
  const float* sc = args.scale;
  const float* bs = args.base;
  const float eps = args.hc_eps;
  float* p = args.pre.row(m);
  float* q = args.post.row(m);
  float* c = args.comb.row(m);
  for (int k = 0; k < hc; ++k) {
    p[k] = deepinfer::cuda::sigmoidf(mixes[k] * sc[0] + bs[k]) + eps;
    q[k] = 2.0f * deepinfer::cuda::sigmoidf(mixes[hc + k] * sc[1] + bs[hc + k]);
  }
  for (int j = 0; j < hc; ++j) {
    float* row = c + j * hc;
    float max_logit = -INFINITY;
    for (int k = 0; k < hc; ++k) {
      row[k] = mixes[2 * hc + j * hc + k] * sc[2] + bs[2 * hc + j * hc + k];
      max_logit = fmaxf(max_logit, row[k]);
    }
    float sum = 0.0f;
    for (int k = 0; k < hc; ++k) {
      row[k] = expf(row[k] - max_logit);
      sum += row[k];
    }
    for (int k = 0; k < hc; ++k) row[k] = row[k] / sum + eps;
  }
  // One column normalization, then (iters - 1) times rows and columns: the reference's order.
  const int column_passes = args.sinkhorn_iters > 1 ? args.sinkhorn_iters : 1;
  for (int iteration = 0; iteration < column_passes; ++iteration) {
    if (iteration > 0) {
      for (int j = 0; j < hc; ++j) {
        float sum = 0.0f;
        for (int k = 0; k < hc; ++k) sum += c[j * hc + k];
        for (int k = 0; k < hc; ++k) c[j * hc + k] /= sum + eps;
      }
    }
    for (int k = 0; k < hc; ++k) {
      float sum = 0.0f;
      for (int j = 0; j < hc; ++j) sum += c[j * hc + k];
      for (int j = 0; j < hc; ++j) c[j * hc + k] /= sum + eps;
    }
  }
}

// One block per row: every mix, then one thread runs the Sinkhorn projection.
__global__ void __launch_bounds__(kThreads) hc_mixes_kernel(MixArgs args) {
  __shared__ float mixes[kMaxMixes];
  const int mix_count = (2 + args.hc) * args.hc;
  hc_mix_dots(args, blockIdx.x, 0, mix_count, mixes);
  if (threadIdx.x == 0) hc_mix_finish(args, blockIdx.x, mixes);
}

// The mixes spread over blocks (blockIdx.y picks `per_block` of them), into mixes_out [M, mixes]:
// at decode one block per row would leave all but a few SMs idle while it reads fn (~2 MB).
__global__ void __launch_bounds__(kThreads)
    hc_mix_dots_kernel(MixArgs args, int per_block, float* mixes_out) {
  __shared__ float mixes[kMaxMixes];
  const int mix_count = (2 + args.hc) * args.hc;
  const int first = static_cast<int>(blockIdx.y) * per_block;
  const int count = min(per_block, mix_count - first);
  hc_mix_dots(args, blockIdx.x, first, count, mixes);
  if (threadIdx.x < count)
    mixes_out[static_cast<int64_t>(blockIdx.x) * mix_count + first + threadIdx.x] =
        mixes[threadIdx.x];
}

__global__ void hc_mix_finish_kernel(MixArgs args, const float* mixes) {
  const int64_t m = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (m >= args.x.rows) return;
  hc_mix_finish(args, m, mixes + m * (2 + args.hc) * args.hc);
}

// false (or DEEPINFER_HC_SPLIT=0): one block per row does every mix (hc_mixes_kernel).
constexpr bool kSplitMixes = true;

bool split_mixes() {
  static const bool enabled = kSplitMixes && !disabled_by_environment("DEEPINFER_HC_SPLIT");
  return enabled;
}

__global__ void hc_collapse_kernel(DeviceRows<const float> x, int64_t hc, int64_t dim,
                                   DeviceRows<const float> pre, DeviceRows<float> out) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= x.rows * dim) return;
  const int64_t m = index / dim;
  const int64_t d = index % dim;
  float sum = 0.0f;
  for (int64_t j = 0; j < hc; ++j) sum += pre.row(m)[j] * x.row(m)[j * dim + d];
  out.row(m)[d] = sum;
}

// One thread per (row, channel) reads every stream's channel before writing any: out may alias
// the residual.
__global__ void hc_expand_kernel(DeviceRows<const float> y, DeviceRows<const float> residual,
                                 int hc, int64_t dim, DeviceRows<const float> post,
                                 DeviceRows<const float> comb, DeviceRows<float> out) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= residual.rows * dim) return;
  const int64_t m = index / dim;
  const int64_t d = index % dim;
  float streams[kMaxStreams];
#pragma unroll
  for (int j = 0; j < kMaxStreams; ++j) {
    if (j < hc) streams[j] = residual.row(m)[j * dim + d];
  }
  const float* weights = comb.row(m);
  const float value = y.row(m)[d];
  for (int k = 0; k < hc; ++k) {
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxStreams; ++j) {
      if (j < hc) sum += weights[j * hc + k] * streams[j];
    }
    out.row(m)[k * dim + d] = post.row(m)[k] * value + sum;
  }
}

}  // namespace

void hc_mixes(const TensorView& x, const TensorView& fn, const TensorView& scale,
              const TensorView& base, const HcParams& params, const TensorView& pre,
              const TensorView& post, const TensorView& comb) {
  MixArgs args{};
  args.hc = params.hc;
  const int64_t mix_count = static_cast<int64_t>(2 + params.hc) * params.hc;
  DI_CHECK(params.hc > 0 && mix_count <= kMaxMixes, "hc_mult ", params.hc, " unsupported");
  args.x = device_rows<const float>(x, "hc streams");
  args.fn = device_rows<const float>(fn, "hc fn");
  args.scale = deepinfer::cuda::device_flat<const float>(scale, "hc scale");
  args.base = deepinfer::cuda::device_flat<const float>(base, "hc base");
  args.pre = device_rows<float>(pre, "hc pre");
  args.post = device_rows<float>(post, "hc post");
  args.comb = device_rows<float>(comb, "hc comb");
  DI_CHECK(args.fn.rows == mix_count && args.fn.cols == args.x.cols, "hc fn ", fn.to_string(),
           " for streams ", x.to_string());
  DI_CHECK(scale.numel() == 3 && base.numel() == mix_count, "hc scale/base shapes");
  DI_CHECK(args.pre.rows == args.x.rows && args.pre.cols == params.hc &&
               args.post.rows == args.x.rows && args.post.cols == params.hc &&
               args.comb.rows == args.x.rows && args.comb.cols == params.hc * params.hc,
           "hc output shapes");
  args.hc_eps = params.hc_eps;
  args.norm_eps = params.norm_eps;
  args.sinkhorn_iters = params.sinkhorn_iters;
  if (args.x.rows == 0) return;
  if (!split_mixes()) {
    hc_mixes_kernel<<<static_cast<unsigned>(args.x.rows), kThreads, 0, current_stream()>>>(args);
    DI_CUDA_LAUNCHED(hc_mixes_kernel);
    return;
  }
  // Few rows: one mix a block, so the step's ~24 fn rows are read by as many SMs; many rows
  // fill the GPU anyway, and a block doing 8 mixes reads its row of x fewer times.
  const int per_block = args.x.rows < 32 ? 1 : 8;
  const unsigned mix_blocks = static_cast<unsigned>((mix_count + per_block - 1) / per_block);
  deepinfer::cuda::StreamBuffer mixes(static_cast<size_t>(args.x.rows * mix_count) * sizeof(float));
  hc_mix_dots_kernel<<<dim3(static_cast<unsigned>(args.x.rows), mix_blocks), kThreads, 0,
                       current_stream()>>>(args, per_block, mixes.as<float>());
  DI_CUDA_LAUNCHED(hc_mix_dots_kernel);
  hc_mix_finish_kernel<<<blocks_for(args.x.rows, 128), 128, 0, current_stream()>>>(
      args, mixes.as<float>());
  DI_CUDA_LAUNCHED(hc_mix_finish_kernel);
}

void hc_collapse(const TensorView& x, const TensorView& pre, const TensorView& out) {
  DI_CHECK(x.rank() == 3, "hc_collapse streams must be [M, hc, D]: ", x.to_string());
  const int64_t hc = x.size(1);
  const int64_t dim = x.size(2);
  const auto in = device_rows<const float>(x, "hc streams");
  const auto p = device_rows<const float>(pre, "hc pre");
  const auto o = device_rows<float>(out, "hc collapse output");
  DI_CHECK(p.rows == in.rows && p.cols == hc && o.rows == in.rows && o.cols == dim,
           "hc_collapse shapes");
  if (in.rows * dim == 0) return;
  hc_collapse_kernel<<<blocks_for(in.rows * dim, kThreads), kThreads, 0, current_stream()>>>(
      in, hc, dim, p, o);
  DI_CUDA_LAUNCHED(hc_collapse_kernel);
}

void hc_expand(const TensorView& y, const TensorView& residual, const TensorView& post,
               const TensorView& comb, const TensorView& out) {
  DI_CHECK(residual.rank() == 3, "hc_expand residual must be [M, hc, D]");
  const int64_t hc = residual.size(1);
  const int64_t dim = residual.size(2);
  DI_CHECK(hc <= kMaxStreams, "hc_expand supports up to ", kMaxStreams, " streams, got ", hc);
  const auto in = device_rows<const float>(y, "hc sublayer output");
  const auto r = device_rows<const float>(residual, "hc residual");
  const auto q = device_rows<const float>(post, "hc post");
  const auto c = device_rows<const float>(comb, "hc comb");
  const auto o = device_rows<float>(out, "hc expand output");
  DI_CHECK(in.rows == r.rows && in.cols == dim && q.cols == hc && c.cols == hc * hc &&
               o.rows == r.rows && o.cols == hc * dim,
           "hc_expand shapes");
  if (r.rows * dim == 0) return;
  hc_expand_kernel<<<blocks_for(r.rows * dim, kThreads), kThreads, 0, current_stream()>>>(
      in, r, static_cast<int>(hc), dim, q, c, o);
  DI_CUDA_LAUNCHED(hc_expand_kernel);
}

}  // namespace deepinfer::ops::cuda
