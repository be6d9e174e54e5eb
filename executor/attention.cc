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

void AbsorbQueries(ThreadPool* pool, const MlaDims& d, const Tensor& kv_b,
                   const float* q, int64_t n, float* q_abs) {
  const int64_t ld = d.latent_dim();
  const int64_t qk = d.nope + d.rope;
  const int64_t per_head = d.nope + d.v;
  ForEachHead(pool, d.heads, [&](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h) {
      // q_abs[t, h, :kv_lora] = Σ_i q_nope[t, h, i] · W_UK[h][i, :].
      WeightedRowSums(q + h * qk, d.heads * qk, n,
                      kv_b.ptr() + h * per_head * d.kv_lora, d.kv_lora, d.nope,
                      d.kv_lora, q_abs + h * ld, d.heads * ld);
      for (int64_t t = 0; t < n; ++t) {
        const float* qh = q + (t * d.heads + h) * qk;
        std::copy(qh + d.nope, qh + qk,
                  q_abs + (t * d.heads + h) * ld + d.kv_lora);
      }
    }
  });
}

void AbsorbedAttend(ThreadPool* pool, const MlaDims& d, const float* q_abs,
                    const float* latent, int64_t num_selected, float* o_lat) {
  const int64_t ld = d.latent_dim();
  // One chunk of heads per thread: the selected rows are read once per
  // chunk for all of its heads.
  const int64_t threads = pool ? pool->num_threads() : 1;
  const int64_t grain = (d.heads + threads - 1) / threads;
  auto body = [&](int64_t begin, int64_t end) {
    const int64_t heads = end - begin;
    std::vector<float> p(static_cast<size_t>(heads * num_selected));
    // p[h, s] = q_abs[h]·c_s, then scaled and softmaxed per head.
    DotMatrix(latent, ld, num_selected, q_abs + begin * ld, ld, heads, ld,
              p.data(), num_selected);
    for (int64_t h = 0; h < heads; ++h) {
      float* ph = p.data() + h * num_selected;
      for (int64_t s = 0; s < num_selected; ++s) ph[s] *= d.scale;
      SoftmaxInPlace(ph, num_selected);
    }
    WeightedRowSums(p.data(), num_selected, heads, latent, ld, num_selected,
                    d.kv_lora, o_lat + begin * d.kv_lora, d.kv_lora);
  };
  if (pool) {
    pool->ParallelFor(d.heads, grain, body);
  } else {
    body(0, d.heads);
  }
}

void ProjectValues(ThreadPool* pool, const MlaDims& d, const Tensor& kv_b,
                   const float* o_lat, int64_t n, float* out) {
  const int64_t per_head = d.nope + d.v;
  ForEachHead(pool, d.heads, [&](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h) {
      const float* w_uv = kv_b.ptr() + (h * per_head + d.nope) * d.kv_lora;
      // out[t, h, j] = W_UV[h][j, :] · o_lat[t, h, :].
      DotMatrix(w_uv, d.kv_lora, d.v, o_lat + h * d.kv_lora,
                d.heads * d.kv_lora, n, d.kv_lora, out + h * d.v,
                d.heads * d.v);
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
