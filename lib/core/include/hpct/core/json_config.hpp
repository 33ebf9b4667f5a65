// hpct/core/json_config.hpp — strict, typed reading of JSON configs (ds_config.json, profiles).
//
// Every value is read through a JsonSection that knows its dotted path ("optimizer.params.lr") and
// file, so a wrong type names the key, and finish() turns every key nobody asked for into an error
// ("unknown key"), which is how typos in a config are caught before a week-long run starts.
// Not a schema language: the typed config structs stay the source of truth.
#pragma once
#include <nlohmann/json.hpp>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "hpct/core/error.hpp"

namespace hpct {

/// The deepest nesting parse_json accepts: no config, header or attribute of ours comes near it,
/// and it keeps every later walk of the value (dump, destruction) shallow.
inline constexpr int kMaxJsonDepth = 64;

/// Parses untrusted JSON text (a config, a checkpoint attribute, a file header): syntax errors,
/// numbers out of double range (1e999) and nesting deeper than kMaxJsonDepth become one hpct::Error
/// naming `where` (a file, or "file: attribute 'x'"). Comments are allowed when `comments`.
nlohmann::json parse_json(const std::string& text, const std::string& where, bool comments = false);

/// A value for an error message: its JSON text, cut to `max_chars` with "..." when longer.
std::string json_excerpt(const nlohmann::json& v, size_t max_chars = 80);

class JsonSection {
 public:
  JsonSection(const nlohmann::json& j, std::string file, std::string path = "");

  /// Loads a file; JSON parse errors name the file, line and column.
  static nlohmann::json load_file(const std::string& path);

  bool has(const std::string& key) const;
  JsonSection section(const std::string& key);  // must be an object
  std::optional<double> get_number(const std::string& key);
  std::optional<long long> get_int(const std::string& key);  // rejects 1.5, accepts 2.0 and "auto"-free ints
  std::optional<bool> get_bool(const std::string& key);
  std::optional<std::string> get_string(const std::string& key);
  /// Marks a key as known without reading it (accepted and ignored on purpose; documented by the caller).
  void ignore(const std::string& key) { seen_.insert(key); }
  /// Throws for the first key present in the object that was never read; after collect_unknown()
  /// records them instead.
  void finish() const;
  /// From now on finish() here and in every section taken from this one records the unknown keys,
  /// and throw_unknown() names them all in one error (so a config with three typos is fixed once).
  void collect_unknown() { unknown_ = std::make_shared<std::vector<std::string>>(); }
  void throw_unknown() const;

  std::string key_path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  const std::string& file() const { return file_; }

 private:
  const nlohmann::json* find(const std::string& key);
  [[noreturn]] void type_error(const std::string& key, const char* want) const;
  const nlohmann::json& j_;
  std::string file_;
  std::string path_;
  std::set<std::string> seen_;
  std::shared_ptr<std::vector<std::string>> unknown_;  // collect_unknown(): shared with sections
};

}  // namespace hpct
