#include "api/overrides.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "api/check.h"

namespace mla_decode {
namespace {

// Calls f(key, value) for each "key=value" of `text`.
template <typename F>
void for_each_pair(const std::string& text, F&& f) {
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(';', pos);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    MLA_CHECK(eq != std::string::npos && eq > 0, "mla_decode: overrides must be 'key=value' pairs separated by ';', "
              "but '", item, "' is not one.");
    f(item.substr(0, eq), item.substr(eq + 1));
  }
}

int64_t parse_int(const std::string& key, const std::string& v, int64_t lo, int64_t hi) {
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  MLA_CHECK(!v.empty() && *end == '\0' && errno == 0 && x >= lo && x <= hi, "mla_decode: the override ", key,
            " must be an integer in [", lo, ", ", hi, "], but it is '", v, "'.");
  return x;
}

bool parse_bool(const std::string& key, const std::string& v) { return parse_int(key, v, 0, 1) == 1; }

// Applies a device-fact key to `facts`; false if `key` is not one.
bool apply_fact(plan::DeviceFacts& facts, const std::string& key, const std::string& v) {
  if (key == "vendor") {
    MLA_CHECK(v == "nvidia" || v == "amd", "mla_decode: the override vendor must be 'nvidia' or 'amd', but it is '",
              v, "'.");
    facts.vendor = v == "amd" ? plan::Vendor::kAmd : plan::Vendor::kNvidia;
  } else if (key == "arch") {
    facts.arch = static_cast<int>(parse_int(key, v, 0, 100000));
  } else if (key == "sm90a") {
    facts.sm90a_kernels = parse_bool(key, v);
  } else if (key == "tensor_maps") {
    facts.tensor_maps = parse_bool(key, v);
  } else if (key == "num_sms") {
    facts.num_sms = static_cast<int>(parse_int(key, v, 1, 1 << 20));
  } else if (key == "smem_per_block") {
    facts.smem_per_block_optin = static_cast<int>(parse_int(key, v, 0, 1 << 30));
  } else if (key == "smem_per_sm") {
    facts.smem_per_sm = static_cast<int>(parse_int(key, v, 0, 1 << 30));
  } else if (key == "l2_bytes") {
    facts.l2_bytes = parse_int(key, v, 0, int64_t{1} << 40);
  } else {
    return false;
  }
  return true;
}

}  // namespace

ParsedOverrides parse_overrides(const std::string& text) {
  ParsedOverrides out;
  for_each_pair(text, [&](const std::string& key, const std::string& v) {
    if (key == "kernel") {
      MLA_CHECK(plan::kernel_from_name(v.c_str(), &out.plan.kernel), "mla_decode: the override kernel must name a "
                "split kernel (mma_sync, wide, narrow, narrow_register_v, mfma), but it is '", v, "'.");
      out.plan.force_kernel = true;
    } else if (key == "smem_limit") {
      out.plan.smem_limit = static_cast<int>(parse_int(key, v, 1, 1 << 30));
    } else if (key == "cpu_path") {
      MLA_CHECK(cpu_path_from_name(v.c_str(), &out.cpu.path), "mla_decode: the override cpu_path names no CPU path "
                "of this build: '", v, "'.");
    } else if (apply_fact(out.facts, key, v)) {
      out.has_facts = true;
    } else {
      MLA_CHECK(false, "mla_decode: unknown override '", key, "' (known: kernel, smem_limit, cpu_path, vendor, arch, "
                "sm90a, tensor_maps, num_sms, smem_per_block, smem_per_sm, l2_bytes).");
    }
  });
  return out;
}

plan::DeviceFacts merge_facts(const std::string& text, const plan::DeviceFacts& base) {
  plan::DeviceFacts facts = base;
  for_each_pair(text, [&](const std::string& key, const std::string& v) { apply_fact(facts, key, v); });
  return facts;
}

std::string describe_plan(const plan::Plan& plan, const MlaDecodeParams& p, const plan::DeviceFacts& device) {
  plan::DeviceFacts facts = device;
  facts.smem_per_block_optin = plan.smem_limit;  // as planned (Overrides::smem_limit)
  std::string s = detail::message("kernel=", plan::kernel_name(plan.kernel), ";head_groups=", plan.head_groups,
                                  ";splits=", plan.num_splits, ";stages=", plan.stages, ";smem=", plan.smem_bytes,
                                  ";smem_limit=", plan.smem_limit, ";stream_kv=", plan.stream_kv ? 1 : 0,
                                  ";tma_tiles=", plan.tma_tiles ? 1 : 0,
                                  ";why=", plan.why);
  if (plan.error != nullptr) s += detail::message(";error=", plan.error);
  std::string rejected;
  for (int k = 0; k < plan::kNumKernels; ++k) {
    const auto kernel = static_cast<plan::Kernel>(k);
    if (kernel == plan.kernel) continue;
    const char* no = plan::why_not(kernel, p, facts);
    if (!rejected.empty()) rejected += '|';
    rejected += detail::message(plan::kernel_name(kernel), ": ",
                                no != nullptr ? no : "applies, but the plan prefers the chosen kernel for this call");
  }
  return s + ";not=" + rejected;
}

}  // namespace mla_decode
