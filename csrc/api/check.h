// MLA_CHECK: TORCH_CHECK with a message built without iostreams.
//
// Error messages are assembled here with std::to_string / snprintf and handed
// to TORCH_CHECK as one std::string. Formatting numbers through std::ostream
// inside the extension crashed on a toolchain whose libstdc++ differs from
// the one torch was built with (seen on the H200 image: a segfault in
// basic_ostream::_M_insert<long> while building a message), so no code in
// this extension formats numbers through streams.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <string>
#include <type_traits>

namespace mla_decode {
namespace detail {

inline void append(std::string& s, const char* v) { s += v; }
inline void append(std::string& s, const std::string& v) { s += v; }
inline void append(std::string& s, char v) { s += v; }
template <typename T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, char>, int> = 0>
inline void append(std::string& s, T v) {
  s += std::to_string(v);
}
inline void append(std::string& s, double v) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  s += buf;
}
inline void append(std::string& s, float v) { append(s, static_cast<double>(v)); }
inline void append(std::string& s, at::ScalarType t) { s += c10::toString(t); }
inline void append(std::string& s, const c10::Device& d) { s += d.str(); }
inline void append(std::string& s, c10::IntArrayRef a) {
  s += '[';
  for (size_t i = 0; i < a.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(a[i]);
  }
  s += ']';
}

template <typename... Args>
std::string message(const Args&... args) {
  std::string s;
  (append(s, args), ...);
  return s;
}

}  // namespace detail
}  // namespace mla_decode

#define MLA_CHECK(cond, ...) TORCH_CHECK((cond), ::mla_decode::detail::message(__VA_ARGS__))

// A platform limit rather than bad input (this build or device has no kernel
// for the call): raises NotImplementedError, on which mla_decode.custom_kernel
// takes its next path. Every other check raises RuntimeError.
#define MLA_CHECK_SUPPORTED(cond, ...) \
  TORCH_CHECK_NOT_IMPLEMENTED((cond), ::mla_decode::detail::message(__VA_ARGS__))
