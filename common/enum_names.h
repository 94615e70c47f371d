#pragma once

// An enum's names written once, in one table, for both directions: the name a value is written as
// and the value a name reads as (and the list an error message offers).
//
//   constexpr EnumName<Color> kColorNames[] = {{Color::kRed, "red"}, {Color::kBlue, "blue"}};
//   NameOf(kColorNames, Color::kRed)        // "red"
//   ValueOf(kColorNames, "blue")            // Color::kBlue; std::nullopt for a name not there
//   NamesOf(kColorNames, ", ")              // "red, blue"

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace specwire {

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

// The name of `value`; `otherwise` where the table has none (a value cast from an int).
template <typename E, size_t N>
constexpr const char* NameOf(const EnumName<E> (&names)[N], E value, const char* otherwise = "?") {
  for (const EnumName<E>& n : names) {
    if (n.value == value) return n.name;
  }
  return otherwise;
}

template <typename E, size_t N>
constexpr std::optional<E> ValueOf(const EnumName<E> (&names)[N], std::string_view name) {
  for (const EnumName<E>& n : names) {
    if (name == n.name) return n.value;
  }
  return std::nullopt;
}

// Every name, in the table's order, joined by `separator`.
template <typename E, size_t N>
std::string NamesOf(const EnumName<E> (&names)[N], std::string_view separator) {
  std::string out;
  for (size_t i = 0; i < N; ++i) {
    if (i > 0) out.append(separator);
    out.append(names[i].name);
  }
  return out;
}

}  // namespace specwire
