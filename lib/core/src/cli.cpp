// The command-line parser of every app (see cli.hpp), over CLI11.
//
// CLI11 splits the command line: names and aliases, "--flag=value", values per occurrence,
// nargs='+' lists, and the order of the callbacks (trigger_on_parse: as given). Before it runs,
// unknown flags are taken out (with the values that follow them), so that CLI11 sees only flags it
// knows and the error can name each unknown one; what CLI11 leaves over is a stray value.
#include "hpct/core/cli.hpp"

#include <CLI/CLI.hpp>

#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "hpct/core/error.hpp"
#include "hpct/core/file.hpp"

namespace hpct::cli {

std::vector<std::string> expand_arg_files(const std::vector<std::string>& in) {
  std::vector<std::string> out;
  for (const auto& a : in) {
    if (a.size() < 2 || a[0] != '@') {
      out.push_back(a);
      continue;
    }
    // A regular file of at most 1 MiB: @DIR, @/dev/zero or a FIFO is refused, never read as
    // no flags or streamed without end.
    std::istringstream f(read_regular_file(a.substr(1), "flags file", uint64_t(1) << 20,
                                           "give @PATH of a file such as inputs/gpt-tiny.args"));
    std::string line;
    while (std::getline(f, line)) {
      if (auto h = line.find('#'); h != std::string::npos) line.resize(h);
      std::istringstream is(line);
      std::string tok;
      while (is >> tok) out.push_back(tok);
    }
  }
  return out;
}

long long to_int(const std::string& flag, const std::string& v, long long min, long long max) {
  double d = 0;
  try {
    size_t pos = 0;
    d = std::stod(v, &pos);  // accepts 1e9 as Megatron recipes write token counts
    if (pos != v.size() || !std::isfinite(d) || std::floor(d) != d) throw std::invalid_argument("x");
  } catch (const std::exception&) {
    throw config_error(flag, flag + " expects an integer, got '" + printable(v) + "'");
  }
  if (std::fabs(d) > 9.0e15)  // beyond 2^53 a double no longer holds every integer
    throw config_error(flag, flag + " " + printable(v) + " is out of range (at most 9e15)");
  const auto x = static_cast<long long>(d);
  if (x < min || x > max)
    throw config_error(flag, flag + " " + printable(v) + " is out of range (" +
                                 (min == LLONG_MIN ? std::string("any") : std::to_string(min)) + " to " +
                                 (max == LLONG_MAX ? std::string("any") : std::to_string(max)) + ")");
  return x;
}

double to_double(const std::string& flag, const std::string& v) {
  try {
    size_t pos = 0;
    double d = std::stod(v, &pos);
    if (pos != v.size() || !std::isfinite(d)) throw std::invalid_argument("x");
    return d;
  } catch (const std::exception&) {
    throw config_error(flag, flag + " expects a finite number, got '" + printable(v) + "'");
  }
}

namespace {

struct Spec {
  std::string names;                 // as declared
  std::vector<std::string> all;      // every spelling
  std::string canonical;             // the first long name (or the first name)
  int nvalues = 0;
  std::function<void(const std::string&)> apply;
  std::string help, group;
  bool positional = false, required = false;
};

// A flag-shaped argument: --name, or -x (a short name); a negative number is a value.
bool is_flag(const std::string& s) {
  if (s.size() < 2 || s[0] != '-') return false;
  if (s[1] == '-') return s.size() > 2;
  return !(std::isdigit(static_cast<unsigned char>(s[1])) || s[1] == '.');
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

}  // namespace

struct Parser::Impl {
  std::string prog, hint;
  std::vector<Spec> specs;
  std::map<std::string, size_t> by_name;  // every spelling -> spec
  std::vector<std::string> given;
};

Parser::Parser(std::string prog, std::string hint) : impl_(std::make_unique<Impl>()) {
  impl_->prog = std::move(prog);
  impl_->hint = hint.empty() ? "see --help" : std::move(hint);
}

Parser::~Parser() = default;

Parser& Parser::flag(const std::string& names, int nvalues, std::function<void(const std::string&)> apply,
                     const std::string& help, const std::string& group) {
  Spec s;
  s.names = names;
  std::stringstream ss(names);
  for (std::string n; std::getline(ss, n, ',');)
    if (!n.empty()) s.all.push_back(n);
  if (s.all.empty()) throw Error("cli: a flag without a name");
  s.canonical = s.all[0];
  for (const auto& n : s.all)
    if (n.rfind("--", 0) == 0) {
      s.canonical = n;
      break;
    }
  s.nvalues = nvalues;
  s.apply = std::move(apply);
  s.help = help;
  s.group = group;
  for (const auto& n : s.all) {
    if (!impl_->by_name.emplace(n, impl_->specs.size()).second) throw Error("cli: flag " + n + " declared twice");
  }
  impl_->specs.push_back(std::move(s));
  return *this;
}

Parser& Parser::positional(const std::string& name, std::function<void(const std::string&)> apply, bool required,
                           const std::string& help) {
  Spec s;
  s.names = s.canonical = name;
  s.nvalues = 1;
  s.apply = std::move(apply);
  s.help = help;
  s.positional = true;
  s.required = required;
  impl_->specs.push_back(std::move(s));
  return *this;
}

bool Parser::parse(int argc, char** argv) { return parse(std::vector<std::string>(argv + 1, argv + argc)); }

bool Parser::parse(const std::vector<std::string>& raw) {
  Impl& m = *impl_;
  const std::vector<std::string> expanded = expand_arg_files(raw);
  for (const auto& a : expanded)
    if (a == "-h" || a == "--help") return false;
  std::vector<Error> errors;
  // Unknown flags out, with the values after them (as argparse would have taken them).
  std::vector<std::string> args;
  for (size_t i = 0; i < expanded.size(); ++i) {
    const std::string& a = expanded[i];
    const std::string name = a.substr(0, a.rfind("--", 0) == 0 ? a.find('=') : std::string::npos);
    if (!is_flag(a)) {
      args.push_back(a);
      continue;
    }
    if (auto it = m.by_name.find(name); it != m.by_name.end()) {
      const Spec& s = m.specs[it->second];
      if (s.nvalues != 0 && name == a && (i + 1 >= expanded.size() || is_flag(expanded[i + 1]))) {
        m.given.push_back(s.canonical);
        errors.push_back(config_error(s.canonical, s.canonical + " needs a value", m.hint));
        continue;
      }
      args.push_back(a);
      continue;
    }
    errors.push_back(config_error(name, "unknown flag '" + printable(name) + "'", m.hint));
    while (i + 1 < expanded.size() && !is_flag(expanded[i + 1])) ++i;
  }
  CLI::App app{m.prog};
  app.allow_extras();
  app.set_help_flag();
  std::set<std::string> seen_positional;
  for (const Spec& s : m.specs) {
    auto run = [&m, &errors, &s, &seen_positional](const std::string& value) {
      if (s.positional) seen_positional.insert(s.canonical);
      m.given.push_back(s.canonical);
      try {
        s.apply(value);
      } catch (const Error& e) {
        errors.push_back(e);
      }
    };
    if (s.positional) {
      app.add_option_function<std::string>(s.canonical, run)->trigger_on_parse();
      continue;
    }
    if (s.nvalues == 0) {
      app.add_flag_callback(s.names, [run] { run(""); })->trigger_on_parse();
      continue;
    }
    auto* o = app.add_option_function<std::vector<std::string>>(
        s.names, [run, &s, &errors, &m](const std::vector<std::string>& v) {
          if (s.nvalues > 1 && (int)v.size() != s.nvalues) {  // the command line ended early
            m.given.push_back(s.canonical);
            errors.push_back(config_error(s.canonical, s.canonical + " takes " + std::to_string(s.nvalues) +
                                                           " values, got " + std::to_string(v.size()) + ": '" +
                                                           printable(joined(v)) + "'"));
            return;
          }
          run(joined(v));
        });
    if (s.nvalues < 0) o->expected(1, CLI::detail::expected_max_vector_size);
    else o->expected(s.nvalues)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    o->allow_extra_args(s.nvalues < 0)->trigger_on_parse();
  }
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them last first
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {  // e.g. a value missing at the end: "--lr: 1 required TEXT missing"
    const std::string what = e.what();
    errors.push_back(config_error(what.substr(0, what.find(':')), what, m.hint));
  }
  for (const auto& extra : app.remaining())
    errors.push_back(config_error(extra, "unexpected value '" + printable(extra) + "'", m.hint));
  for (const Spec& s : m.specs)
    if (s.positional && s.required && !seen_positional.count(s.canonical))
      errors.push_back(config_error(s.canonical, m.prog + " needs " + s.canonical, m.hint));
  if (errors.size() == 1) throw errors[0];
  if (!errors.empty()) {
    std::string all;
    for (const auto& e : errors) all += (all.empty() ? "" : "; ") + e.message();
    throw config_error(errors[0].context().key, std::to_string(errors.size()) + " flags are not accepted: " + all, m.hint);
  }
  return true;
}

const std::vector<std::string>& Parser::given() const { return impl_->given; }

bool Parser::declared(const std::string& name) const { return impl_->by_name.count(name) > 0; }

bool Parser::was_given(const std::string& canonical) const {
  for (const auto& g : impl_->given)
    if (g == canonical) return true;
  return false;
}

std::vector<Parser::Entry> Parser::entries() const {
  std::vector<Entry> out;
  for (const Spec& s : impl_->specs) out.push_back({s.canonical, s.names, s.nvalues, s.help, s.group});
  return out;
}

std::string Parser::help(const std::vector<std::string>& order) const {
  std::vector<std::string> groups = order;
  for (const Spec& s : impl_->specs)
    if (std::find(groups.begin(), groups.end(), s.group) == groups.end()) groups.push_back(s.group);
  std::ostringstream os;
  for (const auto& g : groups) {
    bool header = false;
    for (const Spec& s : impl_->specs) {
      if (s.group != g) continue;
      if (!header) os << "\n" << (g.empty() ? "other" : g) << ":\n", header = true;
      std::string names = s.names;
      for (auto& ch : names)
        if (ch == ',') ch = ' ';
      const std::string left = names + (s.nvalues != 0 ? " V" : "");
      os << "  " << left << std::string(std::max<int>(2, 34 - (int)left.size()), ' ') << s.help << "\n";
    }
  }
  return os.str();
}

}  // namespace hpct::cli
