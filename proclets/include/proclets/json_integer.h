// Integers read from untrusted JSON (records on disk, manifests from peers).
//
// nlohmann's get<T>() for an integral T casts a float value unchecked, which
// is undefined behaviour when the float does not fit (1e78 into an int64_t).
// These read an integer member only from a JSON integer and throw
// json::type_error (302) otherwise, like get<T>() does for a string.
#ifndef SILT_PROCLETS_JSON_INTEGER_H_
#define SILT_PROCLETS_JSON_INTEGER_H_

#include <string>
#include <type_traits>

#include "nlohmann/json.hpp"

namespace silt::proclets {

// The integer `v` holds; throws json::type_error if it holds anything else.
template <typename T>
T JsonInteger(const nlohmann::json& v, const char* key) {
  static_assert(std::is_integral_v<T>);
  if (!v.is_number_integer())
    throw nlohmann::json::type_error::create(
        302, std::string(key) + " must be an integer, not " + v.type_name(),
        &v);
  return v.get<T>();
}

// j[key] as an integer; throws json::out_of_range if it is missing.
template <typename T>
T JsonIntegerAt(const nlohmann::json& j, const char* key) {
  return JsonInteger<T>(j.at(key), key);
}

// j[key] as an integer, or `fallback` if it is missing.
template <typename T>
T JsonIntegerOr(const nlohmann::json& j, const char* key, T fallback) {
  auto it = j.find(key);
  if (it == j.end()) return fallback;
  return JsonInteger<T>(*it, key);
}

}  // namespace silt::proclets

#endif  // SILT_PROCLETS_JSON_INTEGER_H_
