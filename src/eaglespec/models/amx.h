// The AMX tile unit (Intel Xeon from the 4th generation on), as our bf16 and int4 linear kernels use
// it: passes of up to 16 rows against a tile of 64 outputs, whose 16 input pairs per block of 32
// inputs sit 256 bytes apart with the 64 outputs' pairs side by side (the unit's own layout for its
// second operand, read in place). Per output, a block adds its 16 pair products to an fp32
// accumulator (tdpbf16ps); the unit computes each output of a row from that row and the weights
// alone, so a row's result does not depend on the other rows of the pass.

#pragma once

#include <cstdint>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

constexpr int64_t AMX_ROWS = 16;  // rows per pass

// Whether our linears run on the tile unit: the CPU has it, Linux lets the process use it, and
// EAGLESPEC_AMX is not "0". Decided once per process, so every call of a layer runs the same path.
inline bool amx_on() {
  static const bool on = [] {
    const char* env = std::getenv("EAGLESPEC_AMX");
    if (env && std::strcmp(env, "0") == 0) return false;
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }();
  return on;
}

// Tiles 0-3: the accumulators of the tile's four slices of 16 outputs for `rows` rows (fp32);
// 4: `rows` rows of 32 inputs (bf16); 5-7: 16 input pairs of 16 outputs (bf16 pairs). The
// configuration is a thread's own state: each thread sets it before its first pass.
inline void amx_configure(int64_t rows) {
  struct alignas(64) {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
  } config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = t < 5 ? rows : 16;
    config.colsb[t] = 64;
  }
  _tile_loadconfig(&config);
}

inline void amx_zero() {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}

// Accumulators += the pass's rows of 32 inputs at `x` (rows `x_stride` bytes apart) times one block
// of the tile at `w`.
inline void amx_block(const void* x, int64_t x_stride, const void* w) {
  const char* b = static_cast<const char*>(w);
  _tile_loadd(4, x, x_stride);
  _tile_loadd(5, b, 256);
  _tile_dpbf16ps(0, 4, 5);
  _tile_loadd(6, b + 64, 256);
  _tile_dpbf16ps(1, 4, 6);
  _tile_loadd(7, b + 128, 256);
  _tile_dpbf16ps(2, 4, 7);
  _tile_loadd(5, b + 192, 256);
  _tile_dpbf16ps(3, 4, 5);
}

// The accumulators to out [rows][64] fp32.
inline void amx_store(float* out) {
  _tile_stored(0, out, 256);
  _tile_stored(1, out + 16, 256);
  _tile_stored(2, out + 32, 256);
  _tile_stored(3, out + 48, 256);
}

#else
inline bool amx_on() { return false; }
#endif
