// Command-line flags as a table, shared by `cuflash run` and `cuflash bench`:
// each flag names its value and default, and parses the value into a field
// of the command's config. One parser for the `--name value` / `--name=value`
// syntax and its errors, one help printer.
#pragma once

#include <charconv>
#include <cstdio>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cuflash::tool {

// What parsing the flags came to; `error` is one line naming the flag.
struct FlagParse {
  enum class Kind { run, help, error } kind = Kind::run;
  std::string error;
};

// A setter returns an empty string on success, else what was wrong with the value.
template <typename Config>
using FlagSetter = std::function<std::string(Config&, std::string_view)>;

template <typename Config>
struct Flag {
  const char* name;
  const char* value_name;  // nullptr: a switch that takes no value
  const char* default_text;
  const char* help;
  FlagSetter<Config> set;  // nullptr: handled by the command after parsing (see `given`)
};

template <typename Int>
std::string parse_int(std::string_view text, Int minimum, Int* value) {
  Int parsed{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), parsed);
  if (error == std::errc::result_out_of_range) return "out of range: " + std::string(text);
  if (error != std::errc() || end != text.data() + text.size())
    return "expected an integer, got '" + std::string(text) + "'";
  if (parsed < minimum) return "must be >= " + std::to_string(minimum) + ", got " + std::string(text);
  *value = parsed;
  return {};
}

// "a,b,c" -> {"a", "b", "c"}; empty items are kept (their parse fails).
inline std::vector<std::string_view> split_list(std::string_view text) {
  std::vector<std::string_view> items;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    items.push_back(text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    if (comma == std::string_view::npos) return items;
    start = comma + 1;
  }
}

// "a, b or c" for an error message.
template <typename Value>
std::string choice_names(const std::vector<std::pair<std::string_view, Value>>& choices) {
  std::string names;
  for (std::size_t i = 0; i < choices.size(); ++i)
    names += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + std::string(choices[i].first);
  return names;
}

template <typename Config>
FlagSetter<Config> int_flag(int Config::*field, int minimum) {
  return [field, minimum](Config& config, std::string_view text) { return parse_int(text, minimum, &(config.*field)); };
}

template <typename Config>
FlagSetter<Config> switch_flag(bool Config::*field, bool value) {
  return [field, value](Config& config, std::string_view) {
    config.*field = value;
    return std::string();
  };
}

// One value out of `choices`; anything else is an error that lists them.
template <typename Config, typename Value>
FlagSetter<Config> choice_flag(Value Config::*field, std::vector<std::pair<std::string_view, Value>> choices) {
  return [field, choices](Config& config, std::string_view text) -> std::string {
    for (const auto& [name, value] : choices)
      if (text == name) {
        config.*field = value;
        return {};
      }
    return "expected " + choice_names(choices) + ", got '" + std::string(text) + "'";
  };
}

// Applies the flags in order. `given` (optional) collects the names of the
// flags that appeared; a flag without a setter only lands there, for the
// command to act on. `command` names it in the unknown-flag message.
template <typename Config>
FlagParse parse_flags(const std::vector<std::string_view>& args, const std::vector<Flag<Config>>& table,
                      const char* command, Config* config, std::set<std::string_view>* given = nullptr) {
  auto fail = [](std::string message) { return FlagParse{FlagParse::Kind::error, std::move(message)}; };
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string_view arg = args[i];
    std::string_view name = arg;
    std::optional<std::string_view> value;
    if (const auto equals = arg.find('='); arg.starts_with("--") && equals != std::string_view::npos) {
      name = arg.substr(0, equals);
      value = arg.substr(equals + 1);
    }
    if (name == "-h" || name == "--help") return {FlagParse::Kind::help, {}};
    const Flag<Config>* flag = nullptr;
    for (const Flag<Config>& candidate : table)
      if (name == candidate.name) flag = &candidate;
    if (flag == nullptr) {
      if (!arg.starts_with("-")) return fail("unexpected argument '" + std::string(arg) + "' (flags start with --)");
      return fail(std::string(name) + ": unknown flag (see cuflash " + command + " --help)");
    }
    if (flag->value_name == nullptr) {
      if (value) return fail(std::string(name) + ": takes no value, got '" + std::string(*value) + "'");
    } else if (!value) {
      if (i + 1 == args.size()) return fail(std::string(name) + ": missing value (" + flag->value_name + ")");
      value = args[++i];
    }
    if (given != nullptr) given->insert(flag->name);
    if (!flag->set) continue;
    if (std::string error = flag->set(*config, value.value_or("")); !error.empty())
      return fail(std::string(name) + ": " + error);
  }
  return {};
}

// "  --name VALUE   help (default: ...)" for every flag.
template <typename Config>
void print_flags(std::FILE* stream, const std::vector<Flag<Config>>& table, int name_width) {
  for (const Flag<Config>& flag : table) {
    std::string left = flag.name;
    if (flag.value_name) left += std::string(" ") + flag.value_name;
    std::fprintf(stream, "  %-*s %s", name_width, left.c_str(), flag.help);
    if (*flag.default_text) std::fprintf(stream, " (default: %s)", flag.default_text);
    std::fprintf(stream, "\n");
  }
}

}  // namespace cuflash::tool
