// CPU implementation of absorbed MLA decode for every cache format.
//
// Work item: one (batch item, query token, group of up to 16 heads). Visible
// keys are taken 32 at a time: their rows are dequantised once into fp32
// scratch rows (never the whole cache), every head of the group scores them,
// then updates its running max / sum (online softmax, one rescale per block)
// and its 512-float accumulator. Accumulation is fp32; the output is rounded
// to bf16 once at the end.
#include "decode_cpu.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/addressing.h"
#include "common/formats.h"

namespace mla_decode {
namespace {

constexpr int kHeadsPerTask = 16;
constexpr int kKeysPerBlock = 32;  // keys dequantised together (72 KB of fp32 rows)
// Splitting a task's keys (see decode_cpu): chunks of at least this many keys,
// and at most this many chunks in all (8.4 MB of partials).
constexpr int64_t kMinChunkKeys = 512;
constexpr int64_t kMaxPartials = 256;

// Decode tables, built once per call: every fp8 code (times the tensor
// scale, the same fp32 product the per-element decode made), and both E2M1
// values of every MXFP4 byte (low nibble first).
struct DecodeTables {
  float fp8[256];
  float e2m1_pair[256][2];
};

DecodeTables make_tables(const MlaDecodeParams& p) {
  DecodeTables t{};
  if (p.format == KvFormat::kFp8E4M3FN || p.format == KvFormat::kFp8E4M3FNUZ) {
    const float s = *p.fp8_scale;
    for (int c = 0; c < 256; ++c) {
      const uint8_t code = static_cast<uint8_t>(c);
      t.fp8[c] = (p.format == KvFormat::kFp8E4M3FN ? e4m3fn_to_float(code) : e4m3fnuz_to_float(code)) * s;
    }
  } else if (p.format == KvFormat::kMxfp4) {
    for (int c = 0; c < 256; ++c) {
      t.e2m1_pair[c][0] = e2m1_to_float(c & 0xF);  // even element in the low nibble
      t.e2m1_pair[c][1] = e2m1_to_float(c >> 4);
    }
  }
  return t;
}

// Dequantises cache row `row` into dst[0:576].
void load_row(const MlaDecodeParams& p, const DecodeTables& tables, int64_t row, float* dst) {
  const uint8_t* base = static_cast<const uint8_t*>(p.kv) + row * p.kv_row_stride_bytes;
  switch (p.format) {
    case KvFormat::kBf16: {
      const uint16_t* v = reinterpret_cast<const uint16_t*>(base);
      for (int d = 0; d < kHeadDimQK; ++d) dst[d] = bf16_bits_to_float(v[d]);
      break;
    }
    case KvFormat::kFp8E4M3FN:
    case KvFormat::kFp8E4M3FNUZ:
      for (int d = 0; d < kHeadDimQK; ++d) dst[d] = tables.fp8[base[d]];
      break;
    case KvFormat::kMxfp4: {
      const uint8_t* sc = p.mx_scale + row * p.mx_scale_stride_row;
      for (int blk = 0; blk < kMxBlocksPerRow; ++blk) {
        const float s = e8m0_to_float(sc[blk * p.mx_scale_stride_col]);
        const uint8_t* bytes = base + blk * (kMxBlock / 2);
        float* d = dst + blk * kMxBlock;
        for (int k = 0; k < kMxBlock / 2; ++k) {
          d[2 * k] = tables.e2m1_pair[bytes[k]][0] * s;
          d[2 * k + 1] = tables.e2m1_pair[bytes[k]][1] * s;
        }
      }
      break;
    }
  }
}

// Dot product of two 576-float rows with 8 independent partial sums, so the
// compiler can vectorise it without reassociating a single sum (no fast-math).
float dot576(const float* a, const float* b) {
  float part[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (int d = 0; d < kHeadDimQK; d += 8) {
    for (int u = 0; u < 8; ++u) part[u] += a[d + u] * b[d + u];
  }
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

// One (query token, head group): the qi-th query of item b, heads h0 .. h0 + nh - 1,
// which sees `visible` keys (split into `chunks` pieces, see chunk_keys).
struct Task {
  int32_t b, qi, h0, nh, visible;
  int32_t chunks;          // pieces its keys are split into (1: not split)
  int64_t partial_offset;  // its first partial record (chunks > 1)
};

// Running softmax state of nh heads: max m, sum l (per head) and the
// 512-float accumulator.
struct Partial {
  float m[kHeadsPerTask];
  float l[kHeadsPerTask];
  float* acc;  // nh x 512
};

// Online softmax over keys [key_begin, key_end) of `task` into `st`. Keys are
// taken kKeysPerBlock at a time: the block's rows are dequantised once into
// `kblock`, every head scores them, and each head's running max / sum and
// accumulator are rescaled once per block (not once per key).
void attend(const MlaDecodeParams& p, const DecodeTables& tables, const Task& task, int32_t key_begin,
            int32_t key_end, const float* qbuf, float* kblock, Partial& st) {
  const int nh = task.nh;
  for (int h = 0; h < nh; ++h) {
    st.m[h] = -std::numeric_limits<float>::infinity();
    st.l[h] = 0.f;
  }
  std::fill(st.acc, st.acc + nh * kHeadDimV, 0.f);
  float score[kKeysPerBlock];
  for (int32_t j0 = key_begin; j0 < key_end; j0 += kKeysPerBlock) {
    const int nk = std::min<int32_t>(kKeysPerBlock, key_end - j0);
    // Out-of-range rows are rejected by check_index_values before we get here.
    for (int k = 0; k < nk; ++k) load_row(p, tables, kv_row(p, task.b, j0 + k), kblock + k * kHeadDimQK);
    for (int h = 0; h < nh; ++h) {
      const float* qh = qbuf + h * kHeadDimQK;
      float block_max = -std::numeric_limits<float>::infinity();
      for (int k = 0; k < nk; ++k) {
        score[k] = dot576(qh, kblock + k * kHeadDimQK) * p.sm_scale;
        block_max = std::max(block_max, score[k]);  // a NaN score is skipped here, and poisons l below
      }
      const float m_new = std::max(st.m[h], block_max);
      float* a = st.acc + h * kHeadDimV;
      if (m_new > st.m[h]) {
        const float alpha = std::exp(st.m[h] - m_new);  // exp(-inf) = 0 on the first block
        st.l[h] *= alpha;
        for (int d = 0; d < kHeadDimV; ++d) a[d] *= alpha;
        st.m[h] = m_new;
      }
      for (int k = 0; k < nk; ++k) {
        const float w = std::exp(score[k] - st.m[h]);  // NaN scores propagate into l and acc
        st.l[h] += w;
        const float* v = kblock + k * kHeadDimQK;
        for (int d = 0; d < kHeadDimV; ++d) a[d] += w * v[d];
      }
    }
  }
}

// The task's query rows as fp32 (nh x 576).
void load_q(const MlaDecodeParams& p, const Task& task, float* qbuf) {
  const int64_t t = static_cast<int64_t>(p.qo_indptr[task.b]) + task.qi;
  const uint16_t* qbase = static_cast<const uint16_t*>(p.q);
  for (int h = 0; h < task.nh; ++h) {
    const uint16_t* qh = qbase + t * p.q_stride_token + static_cast<int64_t>(task.h0 + h) * p.q_stride_head;
    for (int d = 0; d < kHeadDimQK; ++d) qbuf[h * kHeadDimQK + d] = bf16_bits_to_float(qh[d]);
  }
}

// Writes out (bf16) and lse (natural log) of the task's rows from the final
// state; a row that sees no key gets 0 and -inf.
void store(const MlaDecodeParams& p, const Task& task, const Partial& st) {
  const int64_t t = static_cast<int64_t>(p.qo_indptr[task.b]) + task.qi;
  uint16_t* obase = static_cast<uint16_t*>(p.out);
  for (int h = 0; h < task.nh; ++h) {
    uint16_t* o = obase + t * p.out_stride_token + static_cast<int64_t>(task.h0 + h) * p.out_stride_head;
    float* lse = p.lse + t * p.lse_stride_token + static_cast<int64_t>(task.h0 + h) * p.lse_stride_head;
    if (task.visible == 0) {
      for (int d = 0; d < kHeadDimV; ++d) o[d] = 0;
      *lse = -std::numeric_limits<float>::infinity();
      continue;
    }
    const float inv = 1.f / st.l[h];
    const float* a = st.acc + h * kHeadDimV;
    for (int d = 0; d < kHeadDimV; ++d) o[d] = c10::BFloat16(a[d] * inv).x;
    *lse = st.m[h] + std::log(st.l[h]);
  }
}

// Keys of chunk c of a task split into `chunks` pieces (multiples of
// kKeysPerBlock, the last one shorter or empty).
std::pair<int32_t, int32_t> chunk_keys(const Task& task, int32_t c) {
  const int32_t per = (task.visible + task.chunks - 1) / task.chunks;
  const int32_t size = (per + kKeysPerBlock - 1) / kKeysPerBlock * kKeysPerBlock;
  const int32_t begin = std::min(task.visible, c * size);
  return {begin, std::min(task.visible, begin + size)};
}

// Records of one partial: m and l per head, then the nh x 512 accumulator.
constexpr int64_t kPartialFloats = 2 * kHeadsPerTask + kHeadsPerTask * kHeadDimV;

}  // namespace

const char* cpu_path_name(CpuPath path) {
  switch (path) {
    case CpuPath::kAuto: return "auto";
    case CpuPath::kScalar: return "scalar";
  }
  return "unknown";
}

bool cpu_path_from_name(const char* name, CpuPath* path) {
  for (CpuPath c : {CpuPath::kAuto, CpuPath::kScalar}) {
    if (std::strcmp(name, cpu_path_name(c)) == 0) {
      *path = c;
      return true;
    }
  }
  return false;
}

const char* cpu_path_unavailable(CpuPath) { return nullptr; }

std::string describe_cpu_plan(const MlaDecodeParams&, const CpuOptions&) {
  return "kernel=cpu_scalar;why=the portable C++ kernel";
}

void decode_cpu(const MlaDecodeParams& p, const CpuOptions& opt) {
  const char* unavailable = cpu_path_unavailable(opt.path);
  TORCH_CHECK(unavailable == nullptr, std::string("mla_decode: the CPU path '") + cpu_path_name(opt.path) +
                                          "' cannot run on this CPU: " + (unavailable ? unavailable : "") + ".");
  const int32_t head_groups = (p.num_heads + kHeadsPerTask - 1) / kHeadsPerTask;
  const DecodeTables tables = make_tables(p);

  // Tasks: (query row, head group), with qo_indptr mapping a row to its item.
  std::vector<Task> tasks;
  tasks.reserve(static_cast<size_t>(p.total_q) * head_groups);
  for (int32_t b = 0; b < p.batch; ++b) {
    const int32_t q_begin = p.qo_indptr[b], q_len = p.qo_indptr[b + 1] - q_begin;
    const int32_t kv_len = kv_length(p, b);
    for (int32_t qi = 0; qi < q_len; ++qi) {
      for (int32_t g = 0; g < head_groups; ++g) {
        const int32_t h0 = g * kHeadsPerTask;
        tasks.push_back(Task{b, qi, h0, std::min(kHeadsPerTask, p.num_heads - h0),
                             visible_keys(kv_len, q_len, qi), 1, 0});
      }
    }
  }
  // Few tasks with long key ranges (small batches) would leave cores idle, so
  // their keys are split into chunks of at least kMinChunkKeys, at most
  // kMaxPartials chunks in all, merged afterwards. The split follows from the
  // shapes alone, never from the thread count, so results do not depend on it.
  int64_t partials = 0;
  const int64_t n_tasks = static_cast<int64_t>(tasks.size());
  if (n_tasks > 0 && n_tasks < kMaxPartials / 2) {
    const int64_t max_chunks = kMaxPartials / n_tasks;
    for (Task& task : tasks) {
      const int64_t want = task.visible / kMinChunkKeys;
      task.chunks = static_cast<int32_t>(std::max<int64_t>(1, std::min(want, max_chunks)));
      if (task.chunks > 1) {
        task.partial_offset = partials;
        partials += task.chunks;
      }
    }
  }
  std::vector<float> partial(static_cast<size_t>(partials * kPartialFloats));
  std::vector<int64_t> first_piece(tasks.size() + 1, 0);
  for (size_t i = 0; i < tasks.size(); ++i) first_piece[i + 1] = first_piece[i] + tasks[i].chunks;

  // Every piece: a whole task (stored directly) or one chunk of a split task.
  at::parallel_for(0, first_piece.back(), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> kblock(kKeysPerBlock * kHeadDimQK);
    std::vector<float> qbuf(kHeadsPerTask * kHeadDimQK);
    std::vector<float> acc(kHeadsPerTask * kHeadDimV);
    size_t ti = std::upper_bound(first_piece.begin(), first_piece.end(), begin) - first_piece.begin() - 1;
    int64_t loaded_q = -1;
    for (int64_t piece = begin; piece < end; ++piece) {
      while (piece >= first_piece[ti + 1]) ++ti;
      const Task& task = tasks[ti];
      if (loaded_q != static_cast<int64_t>(ti)) {
        load_q(p, task, qbuf.data());
        loaded_q = static_cast<int64_t>(ti);
      }
      const int32_t c = static_cast<int32_t>(piece - first_piece[ti]);
      Partial st;
      if (task.chunks == 1) {
        st.acc = acc.data();
        attend(p, tables, task, 0, task.visible, qbuf.data(), kblock.data(), st);
        store(p, task, st);
      } else {
        float* rec = partial.data() + (task.partial_offset + c) * kPartialFloats;
        st.acc = rec + 2 * kHeadsPerTask;
        const auto keys = chunk_keys(task, c);
        attend(p, tables, task, keys.first, keys.second, qbuf.data(), kblock.data(), st);
        std::copy(st.m, st.m + kHeadsPerTask, rec);
        std::copy(st.l, st.l + kHeadsPerTask, rec + kHeadsPerTask);
      }
    }
  });

  // Merge the chunks of each split task: M = max m_c, l = sum l_c e^(m_c - M),
  // acc = sum acc_c e^(m_c - M) (an empty chunk has m = -inf and weighs 0).
  if (partials == 0) return;
  at::parallel_for(0, n_tasks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(kHeadsPerTask * kHeadDimV);
    for (int64_t ti = begin; ti < end; ++ti) {
      const Task& task = tasks[ti];
      if (task.chunks == 1) continue;
      Partial st;
      st.acc = acc.data();
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int h = 0; h < task.nh; ++h) {
        float m = -std::numeric_limits<float>::infinity();
        for (int32_t c = 0; c < task.chunks; ++c) {
          m = std::max(m, partial[(task.partial_offset + c) * kPartialFloats + h]);
        }
        float l = 0.f;
        float* a = st.acc + h * kHeadDimV;
        for (int32_t c = 0; c < task.chunks; ++c) {
          const float* rec = partial.data() + (task.partial_offset + c) * kPartialFloats;
          const float m_c = rec[h], l_c = rec[kHeadsPerTask + h];
          if (m_c == -std::numeric_limits<float>::infinity() && !std::isnan(l_c)) continue;  // empty chunk
          const float w = std::exp(m_c - m);
          l += l_c * w;
          const float* a_c = rec + 2 * kHeadsPerTask + h * kHeadDimV;
          for (int d = 0; d < kHeadDimV; ++d) a[d] += w * a_c[d];
        }
        st.m[h] = m;
        st.l[h] = l;
      }
      store(p, task, st);
    }
  });
}

}  // namespace mla_decode
