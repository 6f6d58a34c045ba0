// Scalar decoders for the cache formats, usable on the host (the CPU kernel)
// and on the device (slow paths and tests). Bit-exact with the contract in
// docs/formats.md:
//
//   e4m3fn   : 1 sign, 4 exponent (bias 7), 3 mantissa; 0x7F / 0xFF are NaN;
//              no infinities; max 448.
//   e4m3fnuz : 1 sign, 4 exponent (bias 8), 3 mantissa; 0x80 is the only NaN;
//              no negative zero, no infinities; max 240.
//   E2M1     : 1 sign (bit 3 of the nibble), 2 exponent (bias 1), 1 mantissa:
//              magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}.
//   E8M0     : value 2^(byte - 127); byte 0xFF is NaN.
//
// The fast GPU paths decode several values per instruction; tests compare
// them with these scalar versions through the CPU operator.
#pragma once

#include <stdint.h>
#include <string.h>

#include "portability.h"

namespace mla_decode {

MLA_HOST_DEVICE inline float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

MLA_HOST_DEVICE inline float bf16_bits_to_float(uint16_t h) {
  return bits_to_float(static_cast<uint32_t>(h) << 16);
}

// 2^e for integer e in [-149, 127], exact, built from bits (no libm).
MLA_HOST_DEVICE inline float exp2_int(int e) {
  if (e >= -126) return bits_to_float(static_cast<uint32_t>(e + 127) << 23);
  return bits_to_float(1u << (e + 149));  // subnormal
}

MLA_HOST_DEVICE inline float e4m3fn_to_float(uint8_t v) {
  const uint32_t sign = v >> 7, exp = (v >> 3) & 0xF, man = v & 0x7;
  float mag;
  if (exp == 0xF && man == 0x7) {
    mag = bits_to_float(0x7FC00000u);  // NaN
  } else if (exp == 0) {
    mag = static_cast<float>(man) * 0.001953125f;  // man/8 * 2^-6
  } else {
    mag = exp2_int(static_cast<int>(exp) - 7) * (1.0f + static_cast<float>(man) * 0.125f);
  }
  return sign ? -mag : mag;
}

MLA_HOST_DEVICE inline float e4m3fnuz_to_float(uint8_t v) {
  if (v == 0x80) return bits_to_float(0x7FC00000u);  // the only NaN
  const uint32_t sign = v >> 7, exp = (v >> 3) & 0xF, man = v & 0x7;
  float mag;
  if (exp == 0) {
    mag = static_cast<float>(man) * 0.0009765625f;  // man/8 * 2^-7
  } else {
    mag = exp2_int(static_cast<int>(exp) - 8) * (1.0f + static_cast<float>(man) * 0.125f);
  }
  return sign ? -mag : mag;
}

// E2M1 nibble (sign in bit 3) to float.
MLA_HOST_DEVICE inline float e2m1_to_float(uint32_t nibble) {
  const uint32_t mag_code = nibble & 0x7u;
  // {0, 0.5, 1, 1.5, 2, 3, 4, 6}: twice the magnitude is an integer.
  const uint32_t twice = (mag_code < 4u) ? mag_code : ((mag_code & 1u) + 2u) << ((mag_code >> 1) - 1u);
  const float mag = 0.5f * static_cast<float>(twice);
  return (nibble & 0x8u) ? -mag : mag;
}

MLA_HOST_DEVICE inline float e8m0_to_float(uint8_t e) {
  if (e == 0xFF) return bits_to_float(0x7FC00000u);
  return exp2_int(static_cast<int>(e) - 127);
}

}  // namespace mla_decode
