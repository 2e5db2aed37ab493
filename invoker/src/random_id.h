// Short random names (instance ids, aside directories): [a-z0-9]{n}.
#ifndef SILT_INVOKER_RANDOM_ID_H_
#define SILT_INVOKER_RANDOM_ID_H_

#include <cstddef>
#include <random>
#include <string>

namespace silt::invoker {

inline std::string RandomId(size_t n) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::string s;
  for (size_t i = 0; i < n; ++i) s.push_back(kAlphabet[rng() % 36]);
  return s;
}

}  // namespace silt::invoker

#endif  // SILT_INVOKER_RANDOM_ID_H_
