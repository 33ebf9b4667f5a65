// Unit tests of ib_healthcheck's pieces that need no MPI job: profile validation (one-line errors
// naming file and key), thresholds, pairings, nccl-tests' bandwidth formulas, option parsing, and
// the blame logic on synthetic figures (a slow node vs a slow link vs a silent rank).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>

#include "checks.hpp"
#include "evaluate.hpp"
#include "hpct/core/error.hpp"
#include "options.hpp"
#include "profile.hpp"

using namespace hpct;
using namespace hpct::healthcheck;

namespace {

std::string source_dir() {
  const char* s = std::getenv("HPCT_SOURCE_DIR");
  return s ? s : ".";
}

// Writes text to a fresh temporary .json file and returns its path.
std::string temp_profile(const std::string& text) {
  static int n = 0;
  std::string path = "/tmp/hpct_hc_test_" + std::to_string(::getpid()) + "_" + std::to_string(n++) + ".json";
  std::ofstream(path) << text;
  return path;
}

const char* kMinimal = R"({"name": "t", "fabric": {"p2p_bandwidth_GBps": {"min_fraction_of_median": 0.5}}})";

// Expects load_profile to throw an Error whose text names the file and contains every fragment.
void expect_profile_error(const std::string& text, std::vector<std::string> fragments) {
  std::string path = temp_profile(text);
  try {
    load_profile(path);
    ADD_FAILURE() << "no error for " << text;
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;
    for (const auto& f : fragments) EXPECT_NE(what.find(f), std::string::npos) << "'" << f << "' not in: " << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << "not one line: " << what;
  }
  std::remove(path.c_str());
}

}  // namespace

TEST(Profile, ShippedProfilesLoad) {
  Profile local = load_profile(source_dir() + "/inputs/healthcheck/local.json");
  EXPECT_EQ(local.name, "local");
  EXPECT_EQ(local.ib_ports, 0);
  EXPECT_TRUE(local.p2p_bw_GBps.relative.has_value());
  Profile az = load_profile(source_dir() + "/inputs/healthcheck/azure-ndv4.json");
  EXPECT_EQ(az.ib_ports, 8);
  EXPECT_DOUBLE_EQ(az.ib_min_rate_gbps, 200);
  EXPECT_EQ(az.gpu_count, 8);
  EXPECT_DOUBLE_EQ(*az.p2p_bw_GBps.absolute, 22.5);  // 180 Gb/s: Az NHC's per-HCA ib_write_bw limit
  EXPECT_FALSE(az.p2p_latency_us.higher_is_better);
}

TEST(Profile, ErrorsNameFileAndKey) {
  expect_profile_error(R"({"name": "t", "fabric": {"p2p_bandwidth_GBps": {"minimum": 3}}})",
                       {"unknown key", "fabric.p2p_bandwidth_GBps.minimum"});
  expect_profile_error(R"({"name": "t", "fabric": {"p2p_bandwidth_GBps": {"min_fraction_of_median": 1.5}}})",
                       {"fabric.p2p_bandwidth_GBps.min_fraction_of_median", "(0, 1]"});
  expect_profile_error(R"({"name": "t", "fabric": {"p2p_latency_us": {"max_factor_of_median": 0.5}}})",
                       {"fabric.p2p_latency_us.max_factor_of_median", ">= 1"});
  expect_profile_error(R"({"name": "t", "fabric": {"p2p_latency_us": {}}})", {"fabric.p2p_latency_us", "needs"});
  expect_profile_error(R"({"name": "t", "sizes": {"bandwidth": "4Q"}})", {"sizes.bandwidth", "suffix"});
  expect_profile_error(R"({"name": "t", "sizes": {"collective_min": "1M", "collective_max": "64K"}})",
                       {"sizes.collective_max"});
  expect_profile_error(R"({"name": "t", "node": {"ib": {"ports": "eight"}}})", {"node.ib.ports", "integer"});
  expect_profile_error(R"({"name": "t", "node": {"ib": {"link_layer": "Ether"}}})", {"node.ib.link_layer"});
  expect_profile_error(R"({"name": "t", "node": {"cpu": {"model_regex": "(["}}})", {"node.cpu.model_regex"});
  expect_profile_error(R"({"name": "t", "node": {"disk": {"path": "tmp"}}})", {"node.disk.path", "absolute"});
  expect_profile_error(R"({"name": "t", "timeout_s": -1})", {"timeout_s"});
  expect_profile_error(R"({"description": "no name"})", {"name"});
  expect_profile_error(R"({"name": "t", "fabric": )", {"invalid JSON"});
}

TEST(Profile, MissingProfileIsOneClearLine) {
  try {
    load_profile("no-such-cluster");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no profile named 'no-such-cluster'"), std::string::npos) << e.what();
  }
  std::string path = temp_profile(kMinimal);
  EXPECT_EQ(load_profile(path).name, "t");
  std::remove(path.c_str());
}

TEST(Threshold, AbsoluteAndRelative) {
  Threshold bw{true, 10.0, 0.5};
  EXPECT_TRUE(bw.passes(12, 20));
  EXPECT_FALSE(bw.passes(9, 12));   // below the absolute floor
  EXPECT_FALSE(bw.passes(11, 30));  // below half the median
  EXPECT_FALSE(bw.passes(NAN, 30));
  Threshold lat{false, 5.0, 2.0};
  EXPECT_TRUE(lat.passes(2, 1.5));
  EXPECT_FALSE(lat.passes(3.5, 1.5));  // more than twice the median
  EXPECT_FALSE(lat.passes(6, 10));     // above the absolute ceiling
  EXPECT_EQ(Threshold({true, {}, 0.5}).describe(20), ">= 10.00 (0.5 x median 20.00)");
}

TEST(Pairings, PerfectMatchingsWithDistinctPartners) {
  for (int n = 2; n <= 11; ++n) {
    auto rounds = pairings(n, 1000);
    EXPECT_EQ(static_cast<int>(rounds.size()), n % 2 == 0 ? n - 1 : n) << n;
    std::vector<std::set<int>> met(static_cast<size_t>(n));
    for (const auto& r : rounds) {
      int idle = 0;
      for (int i = 0; i < n; ++i) {
        int p = r[static_cast<size_t>(i)];
        if (p < 0) {
          ++idle;
          continue;
        }
        ASSERT_NE(p, i);
        ASSERT_EQ(r[static_cast<size_t>(p)], i) << "round not symmetric, n=" << n;
        EXPECT_TRUE(met[static_cast<size_t>(i)].insert(p).second) << "pair repeats, n=" << n;
      }
      EXPECT_EQ(idle, n % 2) << n;
    }
    for (int i = 0; i < n; ++i) EXPECT_EQ(static_cast<int>(met[static_cast<size_t>(i)].size()), n - 1);  // all pairs
  }
  EXPECT_EQ(pairings(8, 3).size(), 3u);
  EXPECT_TRUE(pairings(1, 5).empty());
}

TEST(Collectives, NcclTestsBusBandwidth) {
  EXPECT_DOUBLE_EQ(busbw_factor("allreduce", 4), 1.5);  // 2(n-1)/n
  EXPECT_DOUBLE_EQ(busbw_factor("alltoall", 4), 0.75);  // (n-1)/n
  EXPECT_DOUBLE_EQ(busbw_factor("allreduce", 2), 1.0);
  EXPECT_EQ(collective_bytes("allreduce", 8, 4), 8u);
  EXPECT_EQ(collective_bytes("alltoall", 8, 4), 16u);  // at least one float per peer
  EXPECT_EQ(collective_bytes("alltoall", 1000, 3), 996u);
  EXPECT_EQ(size_sweep(8, 100), (std::vector<uint64_t>{8, 16, 32, 64, 100}));
}

TEST(Options, ParsingAndErrors) {
  Options o = parse_args({"-p", "local", "--bw-size", "128K", "--inject-fault", "slow:3:mpi_p2p:10", "--drain"});
  EXPECT_EQ(*o.bw_size, 128u * 1024);
  ASSERT_EQ(o.faults.size(), 1u);
  EXPECT_EQ(o.faults[0].rank, 3);
  EXPECT_DOUBLE_EQ(o.faults[0].factor, 10);
  EXPECT_TRUE(o.drain && !o.drain_execute);
  auto err = [](std::vector<std::string> a) {
    try {
      parse_args(a);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(err({"-p", "local", "--frobnicate"}).find("unknown flag '--frobnicate'"), std::string::npos);
  EXPECT_NE(err({"-p", "local", "--bw-size", "12Q"}).find("--bw-size"), std::string::npos);
  EXPECT_NE(err({}).find("no profile"), std::string::npos);
  EXPECT_NE(err({"-p", "local", "--inject-fault", "slow:1:node"}).find("not a fabric check"), std::string::npos);
  EXPECT_NE(err({"-p", "local", "--checks", "mpi_p2p,nccl"}).find("unknown check 'nccl'"), std::string::npos);
  EXPECT_NE(err({"-p", "local", "--timeout", "0"}).find("--timeout"), std::string::npos);
}

// Synthetic p2p rows for every expected row: bandwidth 10 GB/s, latency 2 us, except where the
// callback changes them.
static nlohmann::json rows_for(const std::vector<ExpectedRow>& exp, double (*figure)(const ExpectedRow&)) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& e : exp)
    rows.push_back({{"metric", e.metric}, {"subject", e.subject}, {"value", figure(e)}, {"size", 1024}, {"error", ""}});
  return rows;
}

TEST(Evaluation, SlowNodeIsBlamedNotItsPartners) {
  Profile p = load_profile(source_dir() + "/inputs/healthcheck/local.json");
  std::vector<std::string> nodes = {"n0", "n1", "n2", "n3"};
  auto rounds = pairings(4, 3);
  auto exp = expected_p2p_rows(rounds, nodes);
  auto rows = rows_for(exp, [](const ExpectedRow& e) {
    bool slow = e.a == 3 || e.b == 3;
    if (e.metric == "data") return 0.0;
    if (e.metric == "latency") return slow ? 40.0 : 2.0;
    return slow ? 0.5 : 10.0;
  });
  Evaluation ev(p, nodes);
  ev.add_p2p("mpi_p2p", rows, exp, {});
  EXPECT_EQ(ev.unhealthy_nodes(), std::vector<std::string>{"n3"});
  EXPECT_NE(ev.drain_reason("n3").find("failed with 3 of 3 partners"), std::string::npos) << ev.drain_reason("n3");
  EXPECT_FALSE(ev.healthy());
}

TEST(Evaluation, BadLinkIsNotPinnedOnEitherNode) {
  Profile p = load_profile(source_dir() + "/inputs/healthcheck/local.json");
  std::vector<std::string> nodes = {"n0", "n1", "n2", "n3"};
  auto exp = expected_p2p_rows(pairings(4, 3), nodes);
  auto rows = rows_for(exp, [](const ExpectedRow& e) {
    if (e.metric == "data") return 0.0;
    if (e.metric == "latency") return 2.0;
    return e.a == 0 && e.b == 1 ? 0.5 : 10.0;
  });
  Evaluation ev(p, nodes);
  ev.add_p2p("mpi_p2p", rows, exp, {});
  EXPECT_TRUE(ev.unhealthy_nodes().empty());
  EXPECT_FALSE(ev.healthy());
  EXPECT_NE(ev.verdict_text().find("link n0<->n1"), std::string::npos) << ev.verdict_text();
}

TEST(Evaluation, CorruptDataFailsAndSilentRankIsNamedAlone) {
  Profile p = load_profile(source_dir() + "/inputs/healthcheck/local.json");
  std::vector<std::string> nodes = {"n0", "n1", "n2", "n3"};
  auto exp = expected_p2p_rows(pairings(4, 3), nodes);
  // n2 never reported: its own rows are missing, its partners' rows with it carry timeouts.
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& e : exp) {
    if (e.owner == 2) continue;
    bool with2 = e.a == 2 || e.b == 2;
    rows.push_back({{"metric", e.metric}, {"subject", e.subject}, {"size", 8},
                    {"value", with2 ? nlohmann::json(nullptr) : nlohmann::json(e.metric == "data" ? 0.0 : 5.0)},
                    {"error", with2 ? "timeout: no progress" : ""}});
  }
  Evaluation ev(p, nodes);
  ev.add_silent("mpi_p2p", {2}, 12);
  ev.add_p2p("mpi_p2p", rows, exp, {2});
  EXPECT_EQ(ev.unhealthy_nodes(), std::vector<std::string>{"n2"});
  EXPECT_NE(ev.drain_reason("n2").find("stopped responding"), std::string::npos);
  auto j = ev.json(nlohmann::json::object(), "allocation", 1);
  ASSERT_EQ(j["silent"].size(), 1u);
  EXPECT_EQ(j["silent"][0]["node"], "n2");
  EXPECT_EQ(j["result"], "unhealthy");
}
