// MLA attention kernels (see attention.h).
#include "executor/attention.h"

#include <functional>
#include <vector>

#include "executor/kernels.h"
#include "executor/thread_pool.h"

namespace tierkv::executor {
namespace {

void ForEachHead(ThreadPool* pool, int64_t heads,
                 const std::function<void(int64_t, int64_t)>& body) {
  if (pool) {
    pool->ParallelFor(heads, /*grain=*/1, body);
  } else {
    body(0, heads);
  }
}

}  // namespace

void AbsorbedAttention(ThreadPool* pool, const MlaDims& d, const Tensor& kv_b,
                       const float* q, const float* latent,
                       int64_t num_selected, float* out) {
  const int64_t ld = d.latent_dim();
  const int64_t qk = d.nope + d.rope;
  const int64_t per_head = d.nope + d.v;
  ForEachHead(pool, d.heads, [&](int64_t begin, int64_t end) {
    std::vector<float> q_abs(static_cast<size_t>(ld));
    std::vector<float> p(static_cast<size_t>(num_selected));
    std::vector<float> o_lat(static_cast<size_t>(d.kv_lora));
    for (int64_t h = begin; h < end; ++h) {
      const float* qh = q + h * qk;
      const float* w_uk = kv_b.ptr() + h * per_head * d.kv_lora;
      const float* w_uv = w_uk + d.nope * d.kv_lora;
      // q_abs[:kv_lora] = W_UKᵀ q_nope; q_abs[kv_lora:] = q_pe.
      std::fill(q_abs.begin(), q_abs.begin() + d.kv_lora, 0.0f);
      for (int64_t i = 0; i < d.nope; ++i) {
        Axpy(qh[i], w_uk + i * d.kv_lora, q_abs.data(), d.kv_lora);
      }
      std::copy(qh + d.nope, qh + qk, q_abs.begin() + d.kv_lora);
      for (int64_t s = 0; s < num_selected; ++s) {
        p[s] = Dot(q_abs.data(), latent + s * ld, ld) * d.scale;
      }
      SoftmaxInPlace(p.data(), num_selected);
      std::fill(o_lat.begin(), o_lat.end(), 0.0f);
      for (int64_t s = 0; s < num_selected; ++s) {
        Axpy(p[s], latent + s * ld, o_lat.data(), d.kv_lora);
      }
      float* oh = out + h * d.v;
      for (int64_t j = 0; j < d.v; ++j) {
        oh[j] = Dot(w_uv + j * d.kv_lora, o_lat.data(), d.kv_lora);
      }
    }
  });
}

void MhaAttention(ThreadPool* pool, const MlaDims& d, const float* q,
                  const float* expanded, const float* latent,
                  int64_t num_selected, float* out) {
  const int64_t ld = d.latent_dim();
  const int64_t qk = d.nope + d.rope;
  const int64_t per_head = d.nope + d.v;
  const int64_t ed = d.expanded_dim();
  ForEachHead(pool, d.heads, [&](int64_t begin, int64_t end) {
    std::vector<float> p(static_cast<size_t>(num_selected));
    for (int64_t h = begin; h < end; ++h) {
      const float* qh = q + h * qk;
      for (int64_t s = 0; s < num_selected; ++s) {
        const float* k_nope = expanded + s * ed + h * per_head;
        const float* k_pe = latent + s * ld + d.kv_lora;
        p[s] = (Dot(qh, k_nope, d.nope) + Dot(qh + d.nope, k_pe, d.rope)) *
               d.scale;
      }
      SoftmaxInPlace(p.data(), num_selected);
      float* oh = out + h * d.v;
      std::fill(oh, oh + d.v, 0.0f);
      for (int64_t s = 0; s < num_selected; ++s) {
        Axpy(p[s], expanded + s * ed + h * per_head + d.nope, oh, d.v);
      }
    }
  });
}

}  // namespace tierkv::executor
