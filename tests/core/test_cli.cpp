// The command-line parser every app uses (core/cli.hpp): what a Megatron/argparse user types works
// (--flag value, --flag=value, aliases and short names, nargs='+' lists, exactly-N values, negative
// numbers as values, a repeated flag's last value, @FILE), in command-line order; and a command
// line with several problems gets ONE error naming every unknown flag, stray value and rejected
// value, each by its own message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "hpct/core/cli.hpp"
#include "hpct/core/error.hpp"

using namespace hpct;

namespace {

struct App {
  std::vector<std::string> log;  // what was applied, in order
  cli::Parser p{"app", "see app --help"};
  App() {
    p.flag("--lr", 1, [this](const std::string& v) { log.push_back("lr=" + std::to_string(cli::to_double("--lr", v))); },
           "learning rate", "learning rate");
    p.flag("--bf16", 0, [this](const std::string&) { log.push_back("bf16"); }, "bf16", "mixed precision");
    p.flag("--data-path", -1, [this](const std::string& v) { log.push_back("data=" + v); }, "data", "data");
    p.flag("--rampup-batch-size", 3, [this](const std::string& v) { log.push_back("ramp=" + v); }, "ramp", "training");
    p.flag("-p,--path", 1, [this](const std::string& v) { log.push_back("path=" + v); }, "path", "data");
    p.flag("--deepspeed_config,--deepspeed-config", 1, [this](const std::string& v) { log.push_back("ds=" + v); });
    p.flag("--layers", 1, [this](const std::string& v) {
      log.push_back("layers=" + std::to_string(cli::to_int("--layers", v, 1, 1000)));
    });
  }
};

std::string error_of(App& a, const std::vector<std::string>& args) {
  try {
    a.p.parse(args);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Cli, WhatArgparseUsersType) {
  App a;
  ASSERT_TRUE(a.p.parse({"--lr", "-0.5", "--bf16", "--data-path", "0.7", "A", "0.3", "B", "--lr=3",
                         "--rampup-batch-size", "16", "16", "1000", "-p", "/x", "--deepspeed-config", "ds.json",
                         "--layers", "1e2", "--data-path", "C", "--lr", "1e-4"}));
  const std::vector<std::string> want = {"lr=-0.500000",        "bf16",   "data=0.7 A 0.3 B", "lr=3.000000",
                                         "ramp=16 16 1000",     "path=/x", "ds=ds.json",       "layers=100",
                                         "data=C",              "lr=0.000100"};
  EXPECT_EQ(a.log, want);
  const std::vector<std::string> given = {"--lr", "--bf16", "--data-path", "--lr", "--rampup-batch-size", "--path",
                                          "--deepspeed_config", "--layers", "--data-path", "--lr"};
  EXPECT_EQ(a.p.given(), given);
  EXPECT_TRUE(a.p.was_given("--path"));
  EXPECT_FALSE(a.p.was_given("--nothing"));
}

TEST(Cli, HelpAppliesNothing) {
  App a;
  EXPECT_FALSE(a.p.parse({"--lr", "1", "--help"}));
  EXPECT_FALSE(a.p.parse({"-h"}));
  EXPECT_TRUE(a.log.empty());
  const std::string h = a.p.help({"data", "learning rate"});
  EXPECT_LT(h.find("\ndata:\n"), h.find("\nlearning rate:\n"));
  EXPECT_NE(h.find("  -p --path V"), std::string::npos) << h;
  EXPECT_NE(h.find("  --bf16 "), std::string::npos) << h;
  EXPECT_NE(h.find("\nother:\n"), std::string::npos) << "flags without a group";
}

TEST(Cli, ArgFiles) {
  const std::string f = ::testing::TempDir() + "/cli_test.args";
  {
    std::ofstream o(f);
    o << "# a model shape\n--layers 4   # four\n--lr 0.25\n";
  }
  App a;
  ASSERT_TRUE(a.p.parse({"@" + f, "--lr", "0.5"}));
  EXPECT_EQ(a.log, (std::vector<std::string>{"layers=4", "lr=0.250000", "lr=0.500000"}));
  App b;
  const std::string e = error_of(b, {"@/nonexistent/x.args"});
  EXPECT_NE(e.find("/nonexistent/x.args"), std::string::npos) << e;
  std::remove(f.c_str());
}

TEST(Cli, EveryProblemInOneError) {
  App a;
  const std::string e = error_of(a, {"--hidden", "4", "--lr", "abc", "--layers", "0", "--foo", "--bf16", "stray",
                                     "--rampup-batch-size", "1", "2"});
  for (const char* part : {"unknown flag '--hidden'", "unknown flag '--foo'", "--lr expects a finite number, got 'abc'",
                           "--layers 0 is out of range (1 to 1000)", "unexpected value 'stray'",
                           "--rampup-batch-size takes 3 values, got 2: '1 2'",
                           "see app --help"})
    EXPECT_NE(e.find(part), std::string::npos) << "missing '" << part << "' in: " << e;
  EXPECT_NE(e.find(" flags are not accepted: "), std::string::npos) << e;
  EXPECT_EQ(a.log, (std::vector<std::string>{"bf16"})) << "the good flags still apply (the run stops anyway)";
}

TEST(Cli, OneProblemIsItsOwnError) {
  App a;
  const std::string e = error_of(a, {"--lr"});
  EXPECT_NE(e.find("--lr needs a value"), std::string::npos) << e;
  App c;
  const std::string f = error_of(c, {"--lr", "--bf16", "--path"});
  EXPECT_NE(f.find("2 flags are not accepted: --lr needs a value; --path needs a value"), std::string::npos) << f;
  EXPECT_EQ(c.log, (std::vector<std::string>{"bf16"}));
  App b;
  try {
    b.p.parse({"--hidden", "4"});
    FAIL() << "accepted";
  } catch (const Error& err) {
    EXPECT_EQ(err.context().key, "--hidden");
    EXPECT_EQ(err.message(), "unknown flag '--hidden'");
  }
}

TEST(Cli, Positionals) {
  std::vector<std::string> got;
  cli::Parser p("tool");
  p.positional("command", [&](const std::string& v) { got.push_back("cmd=" + v); }, true);
  p.positional("path", [&](const std::string& v) { got.push_back("path=" + v); }, true);
  p.flag("--out", 1, [&](const std::string& v) { got.push_back("out=" + v); });
  ASSERT_TRUE(p.parse({"list", "--out", "o.txt", "ckpt"}));
  std::sort(got.begin(), got.end());  // positionals apply after the flags, in their own order
  EXPECT_EQ(got, (std::vector<std::string>{"cmd=list", "out=o.txt", "path=ckpt"}));
  cli::Parser q("tool");
  q.positional("command", [](const std::string&) {}, true);
  q.positional("path", [](const std::string&) {}, true);
  try {
    q.parse({"list"});
    FAIL() << "a missing positional was accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("tool needs path"), std::string::npos) << err.what();
  }
}

TEST(Cli, Converters) {
  EXPECT_EQ(cli::to_int("--n", "1e9"), 1000000000LL);
  EXPECT_THROW(cli::to_int("--n", "1.5"), Error);
  EXPECT_THROW(cli::to_int("--n", "4294967298", 0, 2147483647), Error);
  EXPECT_THROW(cli::to_int("--n", "1e20"), Error);
  EXPECT_THROW(cli::to_double("--x", "inf"), Error);
  EXPECT_DOUBLE_EQ(cli::to_double("--x", "-2.5e-3"), -2.5e-3);
}
