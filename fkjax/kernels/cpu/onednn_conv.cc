// 2-D NHWC/HWIO float32 convolutions through oneDNN, as XLA FFI handlers.
//
// XLA:CPU's own convolutions reach about half of what oneDNN does at the
// 16-64 channels of CIFAR ResNets (docs/performance.md); jaxlib's built-in
// oneDNN rewriter is compiled out of the released wheels. Three handlers:
//   fkjax_onednn_conv_fwd          y = conv(x, w)
//   fkjax_onednn_conv_bwd_data     dx from dy and w
//   fkjax_onednn_conv_bwd_weights  dw from x and dy
// Activations stay in JAX's NHWC layout (oneDNN has direct kernels for it);
// the kernel, tiny next to them, is reordered to and from the primitive's
// preferred blocked layout on every call.
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>

#include "oneapi/dnnl/dnnl.hpp"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;

dnnl::engine& Engine() {
  static dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

// Sizes of one convolution: x [n, h, w, c], kernel [kh, kw, c, o],
// y [n, oh, ow, o]; strides and explicit padding (low, high) per axis.
struct Geometry {
  int64_t n, h, w, c, kh, kw, o, oh, ow, sh, sw, pt, pb, pl, pr;

  std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
             int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
             int64_t>
  Key() const {
    return {n, h, w, c, kh, kw, o, oh, ow, sh, sw, pt, pb, pl, pr};
  }
  // oneDNN's logical dimensions are always N, C, H, W (O, I, H, W for
  // weights); the tag says how they lie in memory.
  memory::desc Src(Tag tag) const { return {{n, c, h, w}, Dt::f32, tag}; }
  memory::desc Dst(Tag tag) const { return {{n, o, oh, ow}, Dt::f32, tag}; }
  memory::desc Weights(Tag tag) const {
    return {{o, c, kh, kw}, Dt::f32, tag};
  }
  memory::dims Strides() const { return {sh, sw}; }
  memory::dims PadLow() const { return {pt, pl}; }
  memory::dims PadHigh() const { return {pb, pr}; }
};

dnnl::primitive_attr UserScratchpad() {
  // A primitive with a library-managed scratchpad may not run on two
  // threads at once; XLA can run two convolutions of a step concurrently.
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

dnnl::convolution_forward::primitive_desc ForwardDesc(const Geometry& g) {
  return dnnl::convolution_forward::primitive_desc(
      Engine(), dnnl::prop_kind::forward_training,
      dnnl::algorithm::convolution_direct, g.Src(Tag::nhwc),
      g.Weights(Tag::any), g.Dst(Tag::nhwc), g.Strides(), g.PadLow(),
      g.PadHigh(), UserScratchpad());
}

// Backward-data and backward-weights take the same arguments, hinted by the
// forward primitive.
template <typename Backward>
typename Backward::primitive_desc BackwardDesc(const Geometry& g) {
  return typename Backward::primitive_desc(
      Engine(), dnnl::algorithm::convolution_direct, g.Src(Tag::nhwc),
      g.Weights(Tag::any), g.Dst(Tag::nhwc), g.Strides(), g.PadLow(),
      g.PadHigh(), ForwardDesc(g), UserScratchpad());
}

// One compiled primitive and the reorder between the user's HWIO kernel
// and the layout the primitive wants (absent when they are the same).
struct Plan {
  dnnl::primitive conv;
  memory::desc scratchpad;
  memory::desc weights;  // the primitive's kernel layout
  bool reorder;
  dnnl::reorder weights_reorder;
};

enum class Kind { kForward, kBackwardData, kBackwardWeights };

Plan MakePlan(Kind kind, const Geometry& g) {
  memory::desc user_weights = g.Weights(Tag::hwio);
  Plan plan;
  if (kind == Kind::kForward) {
    auto pd = ForwardDesc(g);
    plan.conv = dnnl::convolution_forward(pd);
    plan.scratchpad = pd.scratchpad_desc();
    plan.weights = pd.weights_desc();
  } else if (kind == Kind::kBackwardData) {
    auto pd = BackwardDesc<dnnl::convolution_backward_data>(g);
    plan.conv = dnnl::convolution_backward_data(pd);
    plan.scratchpad = pd.scratchpad_desc();
    plan.weights = pd.weights_desc();
  } else {
    auto pd = BackwardDesc<dnnl::convolution_backward_weights>(g);
    plan.conv = dnnl::convolution_backward_weights(pd);
    plan.scratchpad = pd.scratchpad_desc();
    plan.weights = pd.diff_weights_desc();
  }
  plan.reorder = plan.weights != user_weights;
  if (plan.reorder) {
    // Forward and backward-data read the kernel: HWIO -> blocked.
    // Backward-weights writes it: blocked -> HWIO.
    auto pd = kind == Kind::kBackwardWeights
                  ? dnnl::reorder::primitive_desc(Engine(), plan.weights,
                                                  Engine(), user_weights)
                  : dnnl::reorder::primitive_desc(Engine(), user_weights,
                                                  Engine(), plan.weights);
    plan.weights_reorder = dnnl::reorder(pd);
  }
  return plan;
}

// Building a primitive JIT-compiles its kernel (milliseconds): once per
// geometry, shared by all threads.
const Plan& GetPlan(Kind kind, const Geometry& g) {
  static std::mutex mutex;
  static auto* plans =
      new std::map<std::pair<int, decltype(g.Key())>, std::unique_ptr<Plan>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = (*plans)[{static_cast<int>(kind), g.Key()}];
  if (!slot) slot = std::make_unique<Plan>(MakePlan(kind, g));
  return *slot;
}

ffi::Error Run(Kind kind, const Geometry& g, float* x, float* w, float* y) {
  try {
    const Plan& plan = GetPlan(kind, g);
    dnnl::stream stream(Engine());
    memory x_mem(g.Src(Tag::nhwc), Engine(), x);
    memory y_mem(g.Dst(Tag::nhwc), Engine(), y);
    memory user_w(g.Weights(Tag::hwio), Engine(), w);
    memory scratch(plan.scratchpad, Engine());  // allocates
    memory conv_w = plan.reorder ? memory(plan.weights, Engine()) : user_w;
    if (kind == Kind::kBackwardWeights) {
      plan.conv.execute(stream, {{DNNL_ARG_SRC, x_mem},
                                 {DNNL_ARG_DIFF_DST, y_mem},
                                 {DNNL_ARG_DIFF_WEIGHTS, conv_w},
                                 {DNNL_ARG_SCRATCHPAD, scratch}});
      if (plan.reorder) {
        plan.weights_reorder.execute(stream, conv_w, user_w);
      }
    } else {
      if (plan.reorder) {
        plan.weights_reorder.execute(stream, user_w, conv_w);
      }
      if (kind == Kind::kForward) {
        plan.conv.execute(stream, {{DNNL_ARG_SRC, x_mem},
                                   {DNNL_ARG_WEIGHTS, conv_w},
                                   {DNNL_ARG_DST, y_mem},
                                   {DNNL_ARG_SCRATCHPAD, scratch}});
      } else {
        plan.conv.execute(stream, {{DNNL_ARG_DIFF_SRC, x_mem},
                                   {DNNL_ARG_WEIGHTS, conv_w},
                                   {DNNL_ARG_DIFF_DST, y_mem},
                                   {DNNL_ARG_SCRATCHPAD, scratch}});
      }
    }
    stream.wait();
  } catch (const dnnl::error& e) {
    return ffi::Error(ffi::ErrorCode::kInternal,
                      std::string("oneDNN convolution failed: ") + e.what());
  }
  return ffi::Error::Success();
}

// x: [n, h, w, c]; w: [kh, kw, c, o]; y: [n, oh, ow, o].
ffi::Error MakeGeometry(ffi::Span<const int64_t> x,
                        ffi::Span<const int64_t> w,
                        ffi::Span<const int64_t> y, int64_t sh, int64_t sw,
                        int64_t pt, int64_t pb, int64_t pl, int64_t pr,
                        Geometry* geometry) {
  if (x.size() != 4 || w.size() != 4 || y.size() != 4) {
    return ffi::Error::InvalidArgument("fkjax onednn conv: rank-4 operands");
  }
  Geometry& g = *geometry;
  g = {x[0], x[1], x[2], x[3], w[0], w[1], w[3], y[1],
       y[2], sh,   sw,   pt,   pb,   pl,   pr};
  if (w[2] != g.c || y[0] != g.n || y[3] != g.o ||
      g.oh != (g.h + pt + pb - g.kh) / sh + 1 ||
      g.ow != (g.w + pl + pr - g.kw) / sw + 1) {
    return ffi::Error::InvalidArgument("fkjax onednn conv: shapes disagree");
  }
  return ffi::Error::Success();
}

ffi::Error Forward(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                   ffi::ResultBuffer<ffi::F32> y, int64_t sh, int64_t sw,
                   int64_t pt, int64_t pb, int64_t pl, int64_t pr) {
  Geometry g;
  ffi::Error error = MakeGeometry(x.dimensions(), w.dimensions(), y->dimensions(), sh,
                        sw, pt, pb, pl, pr, &g);
  if (error.failure()) return error;
  return Run(Kind::kForward, g, x.typed_data(), w.typed_data(),
             y->typed_data());
}

ffi::Error BackwardData(ffi::Buffer<ffi::F32> dy, ffi::Buffer<ffi::F32> w,
                        ffi::ResultBuffer<ffi::F32> dx, int64_t sh,
                        int64_t sw, int64_t pt, int64_t pb, int64_t pl,
                        int64_t pr) {
  Geometry g;
  ffi::Error error = MakeGeometry(dx->dimensions(), w.dimensions(), dy.dimensions(), sh,
                        sw, pt, pb, pl, pr, &g);
  if (error.failure()) return error;
  return Run(Kind::kBackwardData, g, dx->typed_data(), w.typed_data(),
             dy.typed_data());
}

ffi::Error BackwardWeights(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> dy,
                           ffi::ResultBuffer<ffi::F32> dw, int64_t sh,
                           int64_t sw, int64_t pt, int64_t pb, int64_t pl,
                           int64_t pr) {
  Geometry g;
  ffi::Error error = MakeGeometry(x.dimensions(), dw->dimensions(), dy.dimensions(), sh,
                        sw, pt, pb, pl, pr, &g);
  if (error.failure()) return error;
  return Run(Kind::kBackwardWeights, g, x.typed_data(), dw->typed_data(),
             dy.typed_data());
}

}  // namespace

// All three take two float32 operands, return one, and share the geometry
// attributes.
static auto ConvBinding() {
  return ffi::Ffi::Bind()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Ret<ffi::Buffer<ffi::F32>>()
      .Attr<int64_t>("stride_h")
      .Attr<int64_t>("stride_w")
      .Attr<int64_t>("pad_top")
      .Attr<int64_t>("pad_bottom")
      .Attr<int64_t>("pad_left")
      .Attr<int64_t>("pad_right");
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(FkjaxOnednnConvFwd, Forward, ConvBinding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(FkjaxOnednnConvBwdData, BackwardData,
                              ConvBinding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(FkjaxOnednnConvBwdWeights, BackwardWeights,
                              ConvBinding());
