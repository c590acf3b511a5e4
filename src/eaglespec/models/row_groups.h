// How our linear kernels take a call's rows: four at a time (sharing each weight vector), the last
// five as three and two, the last one to three together, never one at a time after a group.
// Every group size computes a row's outputs the same way, so a row's result does not depend on
// the group it falls in.

#pragma once

#include <cstdint>
#include <type_traits>

// f(first_row, std::integral_constant<int, rows>()) for each group, rows in 1..4.
template <typename F>
inline void for_row_groups(int64_t M, F&& f) {
  for (int64_t m = 0; m < M;) {
    const int64_t left = M - m, rows = left == 5 ? 3 : left < 4 ? left : 4;
    switch (rows) {
      case 4: f(m, std::integral_constant<int, 4>()); break;
      case 3: f(m, std::integral_constant<int, 3>()); break;
      case 2: f(m, std::integral_constant<int, 2>()); break;
      default: f(m, std::integral_constant<int, 1>()); break;
    }
    m += rows;
  }
}
