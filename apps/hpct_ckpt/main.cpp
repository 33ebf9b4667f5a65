// hpct_ckpt — lists and verifies hpctrain checkpoints (one process; no MPI launcher needed).
// Thin: resolve the file (a directory's `latest`), read attributes and datasets through
// hpct::io::H5File, recompute each dataset's checksum with the checkpointer's definition.
// Not here yet: export to / import from safetensors.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hpct/comm/mpi.hpp"
#include "hpct/core/error.hpp"
#include "hpct/core/report.hpp"
#include "hpct/core/units.hpp"
#include "hpct/engine/checkpointer.hpp"
#include "hpct/io/h5_file.hpp"

using namespace hpct;

namespace {

const char* kHelp = R"(usage: hpct_ckpt list|verify PATH [--json FILE]

PATH is a checkpoint file (iter_0000050.h5) or a --save directory (its `latest` is used).
  list     the run state and provenance attributes and every tensor with its shape
  verify   also reads every tensor and recomputes its checksum (exit 1 if any differs)
  --json FILE   the same as JSON
Exit status: 0 fine, 1 a tensor fails its checksum or the file cannot be read, 2 usage.
)";

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

int run(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << kHelp;
    return args.empty() ? 2 : 0;
  }
  const std::string cmd = args[0];
  if (cmd != "list" && cmd != "verify") throw config_error(cmd, "unknown command '" + cmd + "'", "use list or verify");
  if (args.size() < 2) throw config_error(cmd, "needs a checkpoint file or directory");
  std::string json_out;
  for (size_t i = 2; i < args.size(); ++i) {
    if (args[i] == "--json" && i + 1 < args.size()) json_out = args[++i];
    else throw config_error(args[i], "unknown argument '" + args[i] + "'", "see --help");
  }
  std::string file = engine::Checkpointer::resolve(args[1]);
  if (file.empty()) throw file_error(args[1], "no checkpoint here (no such file, or a directory without `latest`)");

  io::H5File f = io::H5File::open(file, io::H5File::Mode::read, MPI_COMM_SELF);
  nlohmann::json doc = {{"file", file}};
  for (const char* k : {"format", "software", "tokenizer", "parallel_layout", "architecture", "loss_scaler"})
    if (auto v = f.attr_string("/", k)) doc[k] = *v;
  for (const char* k : {"iteration", "consumed_samples", "optimizer_step", "skipped_iterations", "nan_iterations"})
    if (auto v = f.attr_int("/", k)) doc[k] = *v;
  if (!doc.contains("format")) throw file_error(file, "is not an hpctrain checkpoint (no format attribute)");

  std::printf("# %s\n", file.c_str());
  for (auto it = doc.begin(); it != doc.end(); ++it)
    if (it.key() != "file") std::printf("# %s: %s\n", it.key().c_str(), it.value().is_string() ? it.value().get<std::string>().c_str() : it.value().dump().c_str());

  ReportTable table({{"tensor", ""}, {"shape", ""}, {"elements", ""}, {"checksum", cmd == "verify" ? "verified" : "stored"}});
  std::vector<std::string> failures;
  nlohmann::json tensors = nlohmann::json::array();
  uint64_t total = 0;
  for (const auto& name : f.list_datasets()) {
    auto shape = f.dataset_shape(name);
    uint64_t n = 1;
    for (auto d : shape) n *= static_cast<uint64_t>(d);
    total += n;
    auto stored = f.attr_uint(name, "checksum");
    std::string state = stored ? "present" : "MISSING";
    if (cmd == "verify") {
      std::vector<float> buf(n);
      f.read(name, 0, buf.data(), n);
      uint64_t got = engine::Checkpointer::checksum(buf.data(), 0, n);
      state = !stored ? "MISSING" : got == *stored ? "OK" : "FAILED";
      if (state != "OK") failures.push_back(name + ": checksum " + state);
    }
    table.add_row({name, shape_text(shape), static_cast<int64_t>(n), state});
    tensors.push_back({{"name", name}, {"shape", shape}, {"elements", n}, {"checksum", state},
                       {"offset", f.dataset_file_offset(name)}});
  }
  std::cout << table.text();
  std::printf("# %zu tensors, %s of fp32\n", table.size(), format_bytes(4.0 * static_cast<double>(total)).c_str());
  if (cmd == "verify") std::cout << summary_footer(table.size(), failures);
  doc["tensors"] = tensors;
  doc["result"] = failures.empty() ? "OK" : "FAILED";
  if (!json_out.empty()) write_json_file(json_out, doc);
  f.close();
  return failures.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  comm::Environment env(&argc, &argv);
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const Error& e) {
    std::fprintf(stderr, "hpct_ckpt: error: %s\n", e.what());
    return e.context().key.empty() || e.context().key[0] == '/' ? 1 : 2;
  }
}
