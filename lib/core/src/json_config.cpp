#include "hpct/core/json_config.hpp"

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "hpct/core/file.hpp"

namespace hpct {

JsonSection::JsonSection(const nlohmann::json& j, std::string file, std::string path)
    : j_(j), file_(std::move(file)), path_(std::move(path)) {
  if (!j_.is_object()) throw Error(path_.empty() ? "config must be a JSON object" : "'" + path_ + "' must be a JSON object",
                                   Error::Context{file_, path_, ""});
}

nlohmann::json parse_json(const std::string& text, const std::string& where, bool comments) {
  // The parser itself keeps its own stack (no recursion); the callback stops it at the depth limit
  // before the value grows deep enough for a recursive dump or destructor to overflow ours.
  bool too_deep = false;
  auto limit = [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json&) {
    if ((ev == nlohmann::json::parse_event_t::object_start || ev == nlohmann::json::parse_event_t::array_start) &&
        depth >= kMaxJsonDepth) {
      too_deep = true;
      throw std::length_error("too deep");
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text, limit, true, comments);
  } catch (const std::length_error&) {
    if (!too_deep) throw;
    throw file_error(where, "invalid JSON: nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  } catch (const nlohmann::json::exception& e) {
    // parse_error carries "line L, column C"; out_of_range.406 is a number beyond double (1e999)
    std::string what = e.what();
    auto p = what.find("] ");
    throw file_error(where, "invalid JSON: " + (p == std::string::npos ? what : what.substr(p + 2)));
  }
}

std::string json_excerpt(const nlohmann::json& v, size_t max_chars) {
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > max_chars) s = s.substr(0, max_chars) + "...";
  return s;
}

nlohmann::json JsonSection::load_file(const std::string& path) {
  return parse_json(read_regular_file(path, "config file", uint64_t(64) << 20, "check the path"), path, /*comments=*/true);
}

bool JsonSection::has(const std::string& key) const { return j_.contains(key) && !j_.at(key).is_null(); }

const nlohmann::json* JsonSection::find(const std::string& key) {
  seen_.insert(key);
  auto it = j_.find(key);
  if (it == j_.end() || it->is_null()) return nullptr;
  return &*it;
}

void JsonSection::type_error(const std::string& key, const char* want) const {
  throw Error("'" + key_path(key) + "' must be " + want + ", got " + json_excerpt(j_.at(key)),
              Error::Context{file_, key_path(key), ""});
}

JsonSection JsonSection::section(const std::string& key) {
  const nlohmann::json* v = find(key);
  static const nlohmann::json empty = nlohmann::json::object();
  if (!v) return JsonSection(empty, file_, key_path(key));
  if (!v->is_object()) type_error(key, "an object");
  JsonSection s(*v, file_, key_path(key));
  s.unknown_ = unknown_;
  return s;
}

std::optional<double> JsonSection::get_number(const std::string& key) {
  const nlohmann::json* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_number()) type_error(key, "a number");
  return v->get<double>();
}

std::optional<long long> JsonSection::get_int(const std::string& key) {
  const nlohmann::json* v = find(key);
  if (!v) return std::nullopt;
  if (v->is_number_integer()) return v->get<long long>();
  if (v->is_number_float()) {
    double d = v->get<double>();
    if (std::floor(d) == d && std::fabs(d) < 9e15) return static_cast<long long>(d);
  }
  type_error(key, "an integer");
}

std::optional<bool> JsonSection::get_bool(const std::string& key) {
  const nlohmann::json* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) type_error(key, "true or false");
  return v->get<bool>();
}

std::optional<std::string> JsonSection::get_string(const std::string& key) {
  const nlohmann::json* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_string()) type_error(key, "a string");
  return v->get<std::string>();
}

void JsonSection::finish() const {
  for (auto it = j_.begin(); it != j_.end(); ++it) {
    if (!seen_.count(it.key()) && unknown_)
      unknown_->push_back(key_path(it.key()));
    else if (!seen_.count(it.key()))
      throw Error("unknown key '" + key_path(it.key()) + "'", Error::Context{file_, key_path(it.key()),
                  "remove it or check its spelling against docs/configuration.md"});
  }
}

void JsonSection::throw_unknown() const {
  if (!unknown_ || unknown_->empty()) return;
  const auto& u = *unknown_;
  if (u.size() == 1)
    throw Error("unknown key '" + u[0] + "'", Error::Context{file_, u[0], "remove it or check its spelling against docs/configuration.md"});
  std::string list;
  for (const auto& k : u) list += (list.empty() ? "'" : ", '") + k + "'";
  throw Error(std::to_string(u.size()) + " unknown keys: " + list,
              Error::Context{file_, u[0], "remove them or check their spelling against docs/configuration.md"});
}

}  // namespace hpct
