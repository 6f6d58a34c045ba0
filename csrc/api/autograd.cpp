// Autograd registrations: the operators are inference kernels with no
// backward, and say so instead of letting gradients silently stop.
//
//   decode: the outputs of a call whose q, kv_cache or kv_scale requires grad
//     get an Error node as grad_fn, so backward() raises "mla_decode.decode is
//     not differentiable" (as PyTorch's own ops without a derivative do).
//   decode_out, _decode_out_with: like PyTorch's out= functions, raise at the
//     call when grad mode is on and an argument requires grad.
// Without grad (no_grad, inference_mode, or no input requiring it) each is
// one redispatch below autograd.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "api/check.h"

namespace mla_decode {
namespace {

using OptTensor = c10::optional<at::Tensor>;

bool requires_grad(const OptTensor& t) { return t.has_value() && t->defined() && t->requires_grad(); }

// The first of the float arguments that requires grad, or nullptr.
const char* grad_argument(const at::Tensor& q, const at::Tensor& kv_cache, const OptTensor& kv_scale) {
  if (q.requires_grad()) return "q";
  if (kv_cache.requires_grad()) return "kv_cache";
  if (requires_grad(kv_scale)) return "kv_scale";
  return nullptr;
}

// A new autograd node held the way this torch's graph edges hold nodes
// (std::shared_ptr in some releases, c10::intrusive_ptr in later ones).
template <typename Ptr>
struct NodeMaker;
template <typename T>
struct NodeMaker<std::shared_ptr<T>> {
  template <typename N, typename... Args>
  static std::shared_ptr<N> make(Args&&... args) {
    return std::make_shared<N>(std::forward<Args>(args)...);
  }
};
template <typename T>
struct NodeMaker<c10::intrusive_ptr<T>> {
  template <typename N, typename... Args>
  static c10::intrusive_ptr<N> make(Args&&... args) {
    return c10::make_intrusive<N>(std::forward<Args>(args)...);
  }
};
using NodePtr = std::decay_t<decltype(std::declval<torch::autograd::Edge>().function)>;

constexpr const char* kNoBackward =
    "mla_decode.decode is not differentiable: it is an inference kernel with no backward. Call it under "
    "torch.no_grad() or on detached inputs (mla_decode.reference.reference_decode is a differentiable float64 "
    "reference).";

std::tuple<at::Tensor, at::Tensor> decode_autograd(const at::Tensor& q, const at::Tensor& kv_cache,
                                                   const OptTensor& kv_scale, const at::Tensor& qo_indptr,
                                                   const OptTensor& kv_indptr, const OptTensor& kv_indices,
                                                   const OptTensor& block_table, const OptTensor& kv_lens,
                                                   int64_t page_size, double sm_scale, int64_t num_splits) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("mla_decode::decode", "")
                             .typed<std::tuple<at::Tensor, at::Tensor>(
                                 const at::Tensor&, const at::Tensor&, const OptTensor&, const at::Tensor&,
                                 const OptTensor&, const OptTensor&, const OptTensor&, const OptTensor&, int64_t,
                                 double, int64_t)>();
  const bool grad = at::GradMode::is_enabled() && grad_argument(q, kv_cache, kv_scale) != nullptr;
  std::tuple<at::Tensor, at::Tensor> result;
  {
    at::AutoDispatchBelowADInplaceOrView below;
    result = op.call(q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table, kv_lens, page_size,
                     sm_scale, num_splits);
  }
  if (grad) {
    auto node = NodeMaker<NodePtr>::make<torch::autograd::Error>(
        kNoBackward, torch::autograd::collect_next_edges(q, kv_cache, kv_scale));
    torch::autograd::set_history(std::get<0>(result), node);
    torch::autograd::set_history(std::get<1>(result), node);
  }
  return result;
}

// decode_out / _decode_out_with: no gradient flows into an out= argument.
void check_no_grad_out(const char* op_name, const at::Tensor& q, const at::Tensor& kv_cache,
                       const OptTensor& kv_scale, const at::Tensor& out, const at::Tensor& lse) {
  if (!at::GradMode::is_enabled()) return;
  const char* arg = grad_argument(q, kv_cache, kv_scale);
  if (arg == nullptr && out.requires_grad()) arg = "out";
  if (arg == nullptr && lse.requires_grad()) arg = "lse";
  MLA_CHECK(arg == nullptr, "mla_decode.", op_name, " is not differentiable, but ", arg, " requires grad: it "
            "writes into out and lse with no backward. Call it under torch.no_grad() or on detached tensors.");
}

void decode_out_autograd(const at::Tensor& q, const at::Tensor& kv_cache, const OptTensor& kv_scale,
                         const at::Tensor& qo_indptr, const OptTensor& kv_indptr, const OptTensor& kv_indices,
                         const OptTensor& block_table, const OptTensor& kv_lens, int64_t page_size, double sm_scale,
                         int64_t num_splits, at::Tensor& out, at::Tensor& lse) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("mla_decode::decode_out", "")
                             .typed<void(const at::Tensor&, const at::Tensor&, const OptTensor&, const at::Tensor&,
                                         const OptTensor&, const OptTensor&, const OptTensor&, const OptTensor&,
                                         int64_t, double, int64_t, at::Tensor&, at::Tensor&)>();
  check_no_grad_out("decode_out", q, kv_cache, kv_scale, out, lse);
  {
    at::AutoDispatchBelowADInplaceOrView below;
    op.call(q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table, kv_lens, page_size, sm_scale,
            num_splits, out, lse);
  }
  torch::autograd::impl::bump_version(out);
  torch::autograd::impl::bump_version(lse);
}

void decode_out_with_autograd(const at::Tensor& q, const at::Tensor& kv_cache, const OptTensor& kv_scale,
                              const at::Tensor& qo_indptr, const OptTensor& kv_indptr, const OptTensor& kv_indices,
                              const OptTensor& block_table, const OptTensor& kv_lens, int64_t page_size,
                              double sm_scale, int64_t num_splits, at::Tensor& out, at::Tensor& lse,
                              c10::string_view overrides) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("mla_decode::_decode_out_with", "")
                             .typed<void(const at::Tensor&, const at::Tensor&, const OptTensor&, const at::Tensor&,
                                         const OptTensor&, const OptTensor&, const OptTensor&, const OptTensor&,
                                         int64_t, double, int64_t, at::Tensor&, at::Tensor&, c10::string_view)>();
  check_no_grad_out("_decode_out_with", q, kv_cache, kv_scale, out, lse);
  {
    at::AutoDispatchBelowADInplaceOrView below;
    op.call(q, kv_cache, kv_scale, qo_indptr, kv_indptr, kv_indices, block_table, kv_lens, page_size, sm_scale,
            num_splits, out, lse, overrides);
  }
  torch::autograd::impl::bump_version(out);
  torch::autograd::impl::bump_version(lse);
}

}  // namespace
}  // namespace mla_decode

TORCH_LIBRARY_IMPL(mla_decode, Autograd, m) {
  m.impl("decode", &mla_decode::decode_autograd);
  m.impl("decode_out", &mla_decode::decode_out_autograd);
  m.impl("_decode_out_with", &mla_decode::decode_out_with_autograd);
}
