// hpct/core/cli.hpp — every app's command line: one parser over CLI11 with Megatron's conventions.
//
// What it is: the flags of an app as (names, number of values, an apply function, help, group),
// parsed by CLI11 in command-line order, with what argparse users expect on top: "@FILE" stands for
// the flags written in FILE (fromfile_prefix_chars), "--flag=value" and "--flag value", a flag given
// twice takes its last value, nargs='+' flags take every value up to the next flag. And what
// hpctrain adds: every unknown flag, stray value and rejected value of one command line is named in
// ONE error (a recipe is fixed in one round, not one flag per run), each by the apply function's
// own hpct::Error (which names the flag and what would be right); help grouped by section.
// What it is not: a place for an app's semantics. Values reach apply() as text; the app converts
// them with its checks (to_int, to_double below), so a bad value is one line naming the flag.
// --version is every app's too: print_version_if_asked (report.hpp) answers it before MPI starts.
#pragma once
#include <climits>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace hpct::cli {

/// "@FILE" arguments replaced by the flags written in FILE (whitespace separated, '#' starts a
/// comment), as Python argparse's fromfile_prefix_chars; throws file_error when FILE cannot be read.
std::vector<std::string> expand_arg_files(const std::vector<std::string>& args);

/// Value converters that throw config_error naming the flag: integers (a whole-number "1e9" is
/// accepted, nothing wraps), in [min, max]; numbers (finite).
long long to_int(const std::string& flag, const std::string& v, long long min = LLONG_MIN, long long max = LLONG_MAX);
double to_double(const std::string& flag, const std::string& v);

class Parser {
 public:
  /// prog names the app in messages; hint (default "see --help") goes with every error of the line.
  explicit Parser(std::string prog, std::string hint = "");
  ~Parser();
  Parser(const Parser&) = delete;
  Parser& operator=(const Parser&) = delete;

  /// names: "--lr", or with aliases "-p,--path" / "--deepspeed_config,--deepspeed-config" (the
  /// first long name is the canonical one). nvalues: 0 a switch, 1 one value, -1 one or more
  /// (space-joined, argparse's nargs='+'), N > 1 exactly N (space-joined). apply may throw
  /// hpct::Error; it is called once per occurrence, in command-line order.
  Parser& flag(const std::string& names, int nvalues, std::function<void(const std::string&)> apply,
               const std::string& help = "", const std::string& group = "");
  /// The next positional argument (in the order they are declared); one value each.
  Parser& positional(const std::string& name, std::function<void(const std::string&)> apply, bool required,
                     const std::string& help = "");

  /// Parses args (argv without the program name). Returns false, having applied nothing, when
  /// -h or --help is among them. Throws hpct::Error: the one problem, or one config_error naming
  /// every problem (keyed by the first one's flag).
  bool parse(const std::vector<std::string>& args);
  bool parse(int argc, char** argv);

  /// Canonical names of the flags given, in command-line order (repeats included).
  const std::vector<std::string>& given() const;
  /// Whether a flag of that spelling is declared.
  bool declared(const std::string& name) const;
  bool was_given(const std::string& canonical) const;
  /// Every canonical flag name with its help and group, in declaration order.
  struct Entry {
    std::string name;  // canonical, e.g. "--path"
    std::string names; // as declared, e.g. "-p,--path"
    int nvalues;
    std::string help, group;
  };
  std::vector<Entry> entries() const;
  /// "group:" sections in `order` (then groups not listed, in declaration order), a line per flag:
  /// its names, " V" when it takes a value, and its help.
  std::string help(const std::vector<std::string>& order = {}) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hpct::cli
