// Curriculum learning by a data metric (engine/data_sampling.hpp), under mpirun (1 or 2 ranks), on
// a small indexed corpus the test writes (documents of varying length and vocabulary).
//
// - The analyzer's vocab_rarity equals the definition computed here independently (counts of the
//   training samples' input tokens, sum of ln(total) - ln(count)) within 1e-9 relative (the sums
//   are taken in another order); seqlen is the sample's first document piece; the result does not
//   depend on the number of ranks (each sample is computed on one rank, the rest add exact zeros).
// - The index files round-trip; a damaged file is refused naming it.
// - The sampler: with the threshold at the maximum the one cluster is the whole dataset, and the
//   first N draws are a permutation of it; value difficulty never draws a sample above the step's
//   difficulty, and admits new samples as the difficulty grows; percentile admits N // max per
//   point; a sampler asked for iteration k first (a resume) draws what one stepped there draws.
// - Two metrics (vocab_rarity and seqlen): every draw is allowed by both metrics' difficulties at
//   its iteration, the allowed count is the brute-force count of samples both allow, and a second
//   metric that allows everything gives the one-metric sampler's batches exactly.
// - Training: every rank count draws the same batches; 2 data-parallel ranks equal one within 1e-5
//   relative (fp32 reduction order); stopped at iteration 4 and resumed it equals the straight run
//   bitwise; a header made for another training set is refused naming the file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "hpct/comm/process_grid.hpp"
#include "hpct/core/error.hpp"
#include "hpct/engine/data/data_sampling.hpp"
#include "hpct/engine/loop/trainer.hpp"
#include "hpct/io/indexed_dataset.hpp"
#include "mpi_gtest_main.hpp"
#include "tiny_gpt.hpp"

using namespace hpct;
namespace fs = std::filesystem;
using test::world;

namespace {
constexpr int kVocab = 101, kSeq = 16;

// 40 documents: document d has 5 + (7d mod 23) tokens drawn from the first 10 + 2d ids, so later
// documents are rarer and lengths vary.
std::shared_ptr<const io::IndexedDataset> corpus(const std::string& dir) {
  const std::string prefix = dir + "/corpus";
  if (world().rank() == 0) {
    io::IndexedDatasetBuilder b(prefix, io::DType::uint16);
    for (int d = 0; d < 40; ++d) {
      std::vector<int32_t> doc(5 + (7 * d) % 23);
      for (size_t j = 0; j < doc.size(); ++j) doc[j] = static_cast<int32_t>((j * 7 + d * 3) % (10 + 2 * d)) % kVocab;
      b.add_item(doc);
      b.end_document();
    }
    b.finalize();
  }
  world().barrier();
  return std::make_shared<const io::IndexedDataset>(io::IndexedDataset::open(prefix));
}

struct Fixture {
  std::string dir;
  std::shared_ptr<const io::IndexedDataset> ds;
  std::shared_ptr<io::GptDataset> train;
  std::pair<std::string, std::string> paths;
  std::vector<double> rarity;
  explicit Fixture(const std::string& tag) : dir(test::shared_dir(world(), tag)), ds(corpus(dir)) {
    train = std::make_shared<io::GptDataset>(ds, std::pair<size_t, size_t>{0, 36}, 48, kSeq, 1234);
    rarity = engine::analyze_metric(*train, "vocab_rarity", kVocab, world());
    const nlohmann::json header = {{"seq_length", kSeq}, {"seed", 1234}, {"data_path", "corpus"}, {"split", "969,30,1"}};
    if (world().rank() == 0) paths = engine::write_metric_index(dir + "/an", "vocab_rarity", rarity, header);
    world().bcast_string(paths.first, 0);
    world().bcast_string(paths.second, 0);
  }
  ~Fixture() {
    world().barrier();
    if (world().rank() == 0) fs::remove_all(dir);
  }
};

engine::MetricCurriculumConfig curriculum(const Fixture& f, const std::string& type, int lo, int hi) {
  engine::MetricCurriculumConfig c;
  c.enabled = true;
  c.metric = "vocab_rarity";
  c.index_to_sample_path = f.paths.first;
  c.index_to_metric_path = f.paths.second;
  c.difficulty_type = type;
  c.schedule.enabled = true;
  c.schedule.key = "data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.vocab_rarity";
  c.schedule.schedule_type = "fixed_linear";
  c.schedule.min_difficulty = lo, c.schedule.max_difficulty = hi;
  c.schedule.total_curriculum_step = 6, c.schedule.difficulty_step = 1;
  return c;
}
}  // namespace

TEST(MetricCurriculum, AnalyzerMatchesTheDefinition) {
  Fixture f("mc_an");
  const size_t n = f.train->size();
  ASSERT_EQ(f.rarity.size(), n);
  std::map<int, double> count;
  double total = 0;
  std::vector<int32_t> buf(kSeq + 1);
  for (size_t i = 0; i < n; ++i) {
    f.train->get(i, buf.data());
    for (int t = 0; t < kSeq; ++t) count[buf[t]] += 1, total += 1;
  }
  for (size_t i = 0; i < n; ++i) {
    f.train->get(i, buf.data());
    double want = 0;
    for (int t = 0; t < kSeq; ++t) want += std::log(total) - std::log(count[buf[t]]);
    EXPECT_NEAR(f.rarity[i], want, 1e-9 * want) << "sample " << i;
  }
  const std::vector<double> len = engine::analyze_metric(*f.train, "seqlen", kVocab, world());
  for (size_t i = 0; i < n; ++i) {
    EXPECT_GE(len[i], 1);
    EXPECT_LE(len[i], kSeq);
  }
  // The same on one rank as on all of them, bitwise.
  if (world().size() > 1) {
    const std::vector<double> one = engine::analyze_metric(*f.train, "vocab_rarity", kVocab, comm::Communicator::self());
    EXPECT_EQ(one, f.rarity);
  }
}

TEST(MetricCurriculum, IndexFilesRoundTripAndRefuseDamage) {
  Fixture f("mc_files");
  const engine::MetricIndex ix = engine::read_metric_index(f.paths.first, f.paths.second);
  ASSERT_EQ(ix.order.size(), f.rarity.size());
  EXPECT_EQ(std::set<int64_t>(ix.order.begin(), ix.order.end()).size(), ix.order.size());
  for (size_t i = 0; i < ix.order.size(); ++i) {
    EXPECT_EQ(ix.sorted[i], f.rarity[ix.order[i]]);
    if (i) EXPECT_LE(ix.sorted[i - 1], ix.sorted[i]);
  }
  EXPECT_EQ(ix.header["metric"], "vocab_rarity");
  world().barrier();
  if (world().rank() == 0) fs::resize_file(f.paths.first + ".bin", 8);
  world().barrier();
  try {
    engine::read_metric_index(f.paths.first, f.paths.second);
    FAIL() << "a truncated index was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("_index_to_sample.bin"), std::string::npos) << e.what();
  }
}

// Issue 47 item 14: a sample count near 2^61 passed the size check by wrapping (2^61 + 38527 samples
// of 8 bytes "are" 308216 bytes); an analysis of another dataset was accepted.
TEST(MetricCurriculum, HeadersCannotWrapOrNameAnotherDataset) {
  Fixture f("mc_headers");
  if (world().rank() == 0) {
    nlohmann::json h = nlohmann::json::parse(std::ifstream(f.paths.first + ".json"));
    h["samples"] = (uint64_t(1) << 61) + 38527;
    std::ofstream(f.paths.first + ".json") << h.dump();
    fs::resize_file(f.paths.first + ".bin", 308216);
  }
  world().barrier();
  try {
    engine::read_metric_index(f.paths.first, f.paths.second);
    FAIL() << "a wrapped sample count was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds 308216 bytes"), std::string::npos) << e.what();
  }
  Fixture g("mc_other");
  const auto c = curriculum(g, "value", 0, 100);
  const size_t samples = g.rarity.size();
  EXPECT_NO_THROW(engine::open_curriculum_sampler({c}, samples, kSeq, 1234, "969,30,1", 4, g.dir + "/corpus"));
  try {
    engine::open_curriculum_sampler({c}, samples, kSeq, 1234, "969,30,1", 4, g.dir + "/other_corpus");
    FAIL() << "an analysis of another dataset was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("was made from the dataset corpus; this run trains on"), std::string::npos) << e.what();
  }
}

TEST(MetricCurriculum, SamplerDrawsWhatTheDifficultyAllows) {
  Fixture f("mc_sampler");
  const engine::MetricIndex ix = engine::read_metric_index(f.paths.first, f.paths.second);
  const size_t n = ix.order.size();
  // Threshold at the maximum from step 1: one cluster, the whole dataset, each sample once per pass.
  const int top = (int)std::ceil(ix.sorted.back());
  engine::CurriculumSampler all(curriculum(f, "value", top, top), ix, 7, 8);
  std::vector<int64_t> drawn;
  for (long long it = 0; drawn.size() < n; ++it)
    for (int64_t s : all.batch(it)) drawn.push_back(s);
  EXPECT_EQ(all.allowed(), n);
  EXPECT_EQ(all.clusters(), 1u);
  drawn.resize(n);
  EXPECT_EQ(std::set<int64_t>(drawn.begin(), drawn.end()).size(), n) << "the first pass repeats a sample";
  // Value difficulty from the 25th percentile's value to the maximum: nothing above the step's
  // difficulty, and the allowed set grows.
  const int lo = (int)std::ceil(ix.sorted[n / 4]);
  engine::CurriculumSampler v(curriculum(f, "value", lo, top), ix, 7, 8);
  size_t first_allowed = 0;
  for (long long it = 0; it < 8; ++it) {
    const auto& b = v.batch(it);
    for (int64_t s : b) EXPECT_LE(f.rarity[s], v.difficulty(it)) << "iteration " << it;
    if (it == 0) first_allowed = v.allowed();
  }
  EXPECT_LT(first_allowed, v.allowed());
  EXPECT_EQ(v.allowed(), n);
  EXPECT_GT(v.clusters(), 1u);
  // Percentile: N // max per point (DeepSpeed's sample_per_percentile), all N at the maximum.
  engine::CurriculumSampler p(curriculum(f, "percentile", 4, 8), ix, 7, 8);
  p.batch(0);
  EXPECT_EQ(p.allowed(), n / 8 * 4);
  for (int64_t s : p.batch(1)) EXPECT_LE(f.rarity[s], ix.sorted[p.allowed() - 1]);
  p.batch(6);
  EXPECT_EQ(p.allowed(), n);
  // One sample per point of 100 is none here: refused by name.
  engine::CurriculumSampler none(curriculum(f, "percentile", 50, 100), ix, 7, 8);
  try {
    none.batch(0);
    FAIL() << "an empty curriculum drew a batch";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocab_rarity.min_difficulty"), std::string::npos) << e.what();
  }
  // A resume: asked for iteration 5 first, it draws what a sampler stepped there draws.
  engine::CurriculumSampler a(curriculum(f, "value", lo, top), ix, 7, 8), b(curriculum(f, "value", lo, top), ix, 7, 8);
  for (long long it = 0; it < 5; ++it) a.batch(it);
  EXPECT_EQ(a.batch(5), b.batch(5));
}

TEST(MetricCurriculum, TwoMetricsDrawWhatBothAllow) {
  Fixture f("mc_two");
  const std::vector<double> seqlen = engine::analyze_metric(*f.train, "seqlen", kVocab, world());
  std::pair<std::string, std::string> sp;
  const nlohmann::json header = {{"seq_length", kSeq}, {"seed", 1234}, {"data_path", "corpus"}, {"split", "969,30,1"}};
  if (world().rank() == 0) sp = engine::write_metric_index(f.dir + "/an", "seqlen", seqlen, header);
  world().bcast_string(sp.first, 0);
  world().bcast_string(sp.second, 0);
  const engine::MetricIndex rx = engine::read_metric_index(f.paths.first, f.paths.second);
  const engine::MetricIndex sx = engine::read_metric_index(sp.first, sp.second);
  const size_t n = rx.order.size();
  const int rlo = (int)std::ceil(rx.sorted[n / 3]), rtop = (int)std::ceil(rx.sorted.back());
  const int slo = (int)sx.sorted[n / 2], stop = (int)sx.sorted.back();
  auto by_len = [&](int lo, int hi) {
    engine::MetricCurriculumConfig c = curriculum(f, "value", lo, hi);
    c.metric = "seqlen";
    c.index_to_sample_path = sp.first, c.index_to_metric_path = sp.second;
    c.schedule.key = "data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.seqlen";
    c.schedule.total_curriculum_step = 4;
    return c;
  };
  engine::CurriculumSampler two({curriculum(f, "value", rlo, rtop), by_len(slo, stop)}, {rx, sx}, 7, 8);
  size_t last = 0;
  for (long long it = 0; it < 9; ++it) {
    const auto& b = two.batch(it);
    const std::vector<int> d = two.difficulties(it);
    ASSERT_EQ(d.size(), 2u);
    for (int64_t s : b) {
      EXPECT_LE(f.rarity[s], d[0]) << "iteration " << it << " sample " << s;
      EXPECT_LE(seqlen[s], d[1]) << "iteration " << it << " sample " << s;
    }
    size_t both = 0;
    for (size_t s = 0; s < n; ++s) both += f.rarity[s] <= d[0] && seqlen[s] <= d[1];
    EXPECT_EQ(two.allowed(), both) << "iteration " << it;
    EXPECT_GE(two.allowed(), last);
    last = two.allowed();
  }
  EXPECT_EQ(last, n);
  EXPECT_GT(two.clusters(), 2u);
  // A second metric that allows every sample from the start changes nothing.
  engine::CurriculumSampler one(curriculum(f, "value", rlo, rtop), rx, 7, 8);
  engine::CurriculumSampler open({curriculum(f, "value", rlo, rtop), by_len(stop, stop)}, {rx, sx}, 7, 8);
  for (long long it = 0; it < 9; ++it) EXPECT_EQ(open.batch(it), one.batch(it)) << "iteration " << it;
  // Nothing allowed by both at the start: refused naming the first metric's key and both counts.
  engine::CurriculumSampler none({curriculum(f, "value", (int)rx.sorted.front(), rtop), by_len(0, stop)}, {rx, sx}, 7, 8);
  try {
    none.batch(0);
    FAIL() << "an empty intersection drew a batch";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocab_rarity.min_difficulty"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("allowed by every metric"), std::string::npos) << e.what();
  }
}

namespace {
struct McRun {
  std::vector<double> losses;
  std::vector<int> difficulty;
  std::vector<float> params;
};

McRun train(const Fixture& f, engine::TrainConfig c, const comm::Communicator& comm) {
  comm::ProcessGrid grid(comm, 1, 1);
  c.finalize(grid.dp().size());
  engine::Trainer t(c, grid);
  t.load_checkpoint();
  auto s = t.train(*f.train, nullptr);
  McRun r;
  for (auto& st : s.steps) r.losses.push_back(st.lm_loss), r.difficulty.push_back(st.difficulty);
  r.params = t.gather_params();
  return r;
}

engine::TrainConfig tiny(const Fixture& f, int iters) {
  engine::TrainConfig c = test::tiny_gpt(iters, 2, 4);
  c.mock_data = false;
  c.data_path = {"corpus"};
  c.vocab_file = c.merge_file = "unused";
  c.split = "969,30,1";
  c.lr_decay_iters = 10;
  const engine::MetricIndex ix = engine::read_metric_index(f.paths.first, f.paths.second);
  c.metric_curricula = {curriculum(f, "value", (int)std::ceil(ix.sorted[ix.sorted.size() / 4]), (int)std::ceil(ix.sorted.back()))};
  return c;
}
}  // namespace

TEST(MetricCurriculum, TrainingIsLayoutFreeAndResumesExactly) {
  Fixture f("mc_train");
  const McRun whole = train(f, tiny(f, 10), world());
  ASSERT_EQ(whole.losses.size(), 10u);
  EXPECT_LT(whole.difficulty.front(), whole.difficulty.back());
  if (world().size() > 1) {
    const McRun one = train(f, tiny(f, 10), comm::Communicator::self());
    for (size_t i = 0; i < one.losses.size(); ++i)
      EXPECT_NEAR(whole.losses[i], one.losses[i], 1e-5 * std::fabs(one.losses[i])) << "step " << i + 1;
  }
  const std::string d = test::shared_dir(world(), "mc_ckpt");
  auto first = tiny(f, 4);
  first.save_dir = d;
  train(f, first, world());
  auto rest = tiny(f, 10);
  rest.load_path = d;
  const McRun cont = train(f, rest, world());
  ASSERT_EQ(cont.losses.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(cont.losses[i], whole.losses[4 + i]) << "step " << i + 5;
  EXPECT_EQ(cont.params.size(), whole.params.size());
  EXPECT_EQ(std::memcmp(cont.params.data(), whole.params.data(), 4 * cont.params.size()), 0);
  world().barrier();
  if (world().rank() == 0) fs::remove_all(d);
  // A header made for another training set is refused by name.
  auto other = tiny(f, 10);
  other.seed = 99;
  try {
    train(f, other, world());
    FAIL() << "an index made for seed 1234 was used with seed 99";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("_index_to_sample.json"), std::string::npos) << e.what();
  }
}

int main(int argc, char** argv) { return test::mpi_gtest_main(argc, argv); }
