// hpct_ckpt — lists and verifies hpctrain checkpoints (one process; no MPI launcher needed).
// Thin: resolve the file (a directory's `latest`), read attributes and datasets through
// hpct::io::H5File, recompute each dataset's checksum with the checkpointer's definition.
// export writes a GPT checkpoint's weights as safetensors with the GPT-2 (Hugging Face) tensor
// names and layouts; import turns such a file into a checkpoint at iteration 0 (Adam moments zero)
// that pretrain_gpt --load continues from.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <new>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hpct/comm/mpi.hpp"
#include "hpct/core/error.hpp"
#include "hpct/core/json_config.hpp"
#include "hpct/core/report.hpp"
#include "hpct/core/units.hpp"
#include "hpct/engine/checkpoint_state.hpp"
#include "hpct/engine/checkpointer.hpp"
#include "hpct/io/h5_file.hpp"
#include "hpct/io/safetensors.hpp"
#include "hpct/model/gpt.hpp"

using namespace hpct;

namespace {

const char* kHelp = R"(usage: hpct_ckpt list|verify PATH [--json FILE]
       hpct_ckpt export PATH OUT.safetensors
       hpct_ckpt import IN.safetensors DIR [--num-attention-heads N] [--make-vocab-size-divisible-by M]

PATH is a checkpoint file (iter_0000050.h5) or a --save directory (its `latest` is used).
  list     the run state and provenance attributes and every tensor with its shape
  verify   every check `pretrain_gpt --load` makes of the file: the run state (present, in range,
           its checksum), every tensor the stored architecture needs with its shape and no other,
           and every tensor's checksum recomputed (exit 1 at the first problem, named)
  export   the model weights as safetensors with GPT-2's names (wte.weight, h.0.attn.c_attn.weight,
           ...; linear weights as (in, out), as GPT-2's Conv1D stores them; the vocabulary
           padding rows dropped), fp32
  import   a GPT-2 safetensors file (those names) into DIR/iter_0000000.h5 + DIR/latest, Adam
           moments zero; `pretrain_gpt --load DIR` then continues from those weights. Heads cannot
           be read from the weights: --num-attention-heads (default hidden/64, GPT-2's)
  --json FILE   the same as JSON
Exit status: 0 fine, 1 a tensor fails its checksum or the file cannot be read, 2 usage.
)";

// GPT-2 name <-> ours, and whether the weight is stored transposed ((in, out) in GPT-2's Conv1D).
struct NameMap {
  std::string ours, theirs;
  bool transpose;
};
std::vector<NameMap> gpt2_names(int layers) {
  std::vector<NameMap> m = {{"embedding.word_embeddings.weight", "wte.weight", false},
                            {"embedding.position_embeddings.weight", "wpe.weight", false}};
  for (int l = 0; l < layers; ++l) {
    const std::string o = "layers." + std::to_string(l) + ".", t = "h." + std::to_string(l) + ".";
    m.push_back({o + "input_layernorm.weight", t + "ln_1.weight", false});
    m.push_back({o + "input_layernorm.bias", t + "ln_1.bias", false});
    m.push_back({o + "attention.query_key_value.weight", t + "attn.c_attn.weight", true});
    m.push_back({o + "attention.query_key_value.bias", t + "attn.c_attn.bias", false});
    m.push_back({o + "attention.dense.weight", t + "attn.c_proj.weight", true});
    m.push_back({o + "attention.dense.bias", t + "attn.c_proj.bias", false});
    m.push_back({o + "post_attention_layernorm.weight", t + "ln_2.weight", false});
    m.push_back({o + "post_attention_layernorm.bias", t + "ln_2.bias", false});
    m.push_back({o + "mlp.dense_h_to_4h.weight", t + "mlp.c_fc.weight", true});
    m.push_back({o + "mlp.dense_h_to_4h.bias", t + "mlp.c_fc.bias", false});
    m.push_back({o + "mlp.dense_4h_to_h.weight", t + "mlp.c_proj.weight", true});
    m.push_back({o + "mlp.dense_4h_to_h.bias", t + "mlp.c_proj.bias", false});
  }
  m.push_back({"final_layernorm.weight", "ln_f.weight", false});
  m.push_back({"final_layernorm.bias", "ln_f.bias", false});
  return m;
}

std::vector<float> transposed(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<float> y(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) y[c * rows + r] = x[r * cols + c];
  return y;
}

int export_safetensors(const std::string& path, const std::string& out) {
  std::string file = engine::Checkpointer::resolve(path);
  if (file.empty()) throw file_error(path, "no checkpoint here (no such file, or a directory without `latest`)");
  io::H5File f = io::H5File::open(file, io::H5File::Mode::read, MPI_COMM_SELF);
  // The structure verify checks, before any tensor is read: run state, architecture, tensor set.
  model::GptConfig mc;
  const engine::StoredRun stored = engine::check_structure(f, file, &mc);
  const auto& cfg = stored.meta.config;
  const int layers = mc.num_layers;
  if (!cfg.contains("model") || !cfg["model"].is_object() || !cfg["model"].contains("vocab_size") ||
      !cfg["model"]["vocab_size"].is_number_integer() || cfg["model"]["vocab_size"].get<int64_t>() < 1 ||
      cfg["model"]["vocab_size"].get<int64_t>() > mc.vocab_size)
    throw file_error(file, "has no config.model.vocab_size in 1.." + std::to_string(mc.vocab_size) + " (the padded vocabulary)");
  const int64_t vocab = cfg["model"]["vocab_size"].get<int64_t>();
  nlohmann::json header = {{"__metadata__", {{"format", "pt"}, {"source", file}, {"software", hpct_version()}}}};
  std::vector<std::vector<float>> data;
  uint64_t off = 0;
  for (const auto& nm : gpt2_names(layers)) {
    const std::string ds = engine::Checkpointer::dataset_name("model", nm.ours);
    auto shape = f.dataset_shape(ds);
    uint64_t n = 1;
    for (auto d : shape) n *= static_cast<uint64_t>(d);
    std::vector<float> x(n);
    f.read(ds, 0, x.data(), n);
    if (nm.theirs == "wte.weight") {  // drop the padding rows
      x.resize(static_cast<size_t>(vocab * shape[1]));
      shape[0] = vocab;
    }
    if (nm.transpose) {
      x = transposed(x, shape[0], shape[1]);
      std::swap(shape[0], shape[1]);
    }
    const uint64_t bytes = x.size() * sizeof(float);
    header[nm.theirs] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
    data.push_back(std::move(x));
  }
  f.close();
  std::string h = header.dump();
  while ((8 + h.size()) % 8) h.push_back(' ');  // data starts 8-byte aligned
  std::ofstream o(out, std::ios::binary | std::ios::trunc);
  if (!o) throw file_error(out, "cannot write");
  uint64_t hl = h.size();
  o.write(reinterpret_cast<const char*>(&hl), 8);  // little-endian (x86, aarch64)
  o.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const auto& x : data) o.write(reinterpret_cast<const char*>(x.data()), static_cast<std::streamsize>(x.size() * 4));
  o.close();
  if (!o) throw file_error(out, "writing failed (disk full?)");
  std::printf("# %s: %zu tensors, %s, GPT-2 names, from %s\n", out.c_str(), data.size(), format_bytes(double(off)).c_str(),
              file.c_str());
  return 0;
}

// A positive dimension of an imported tensor that fits the model's int fields.
int dim_of(const io::SafetensorsFile& st, const io::SafetensorsTensor& t, size_t axis, const char* what, int64_t max) {
  if (t.shape.size() != 2)
    throw file_error(st.path(), "tensor " + t.name + " has shape " + shape_string(t.shape) + ", GPT-2's is 2-D");
  const int64_t d = t.shape[axis];
  if (d < 1 || d > max)
    throw file_error(st.path(), "tensor " + t.name + " has shape " + shape_string(t.shape) + ": " + what +
                                    " must be 1.." + std::to_string(max));
  return static_cast<int>(d);
}

int import_safetensors(const std::string& in, const std::string& dir, int heads, int vocab_multiple) {
  // Every header rule (offsets, sizes, dtypes) is checked by the reader before anything is copied;
  // every tensor must then have exactly the shape this GPT gives its name.
  const io::SafetensorsFile sf = io::SafetensorsFile::open(in);
  auto need = [&](const std::string& name) -> const io::SafetensorsTensor& {
    const auto* t = sf.find(name);
    if (!t) throw file_error(in, "has no tensor '" + name + "' (GPT-2 names expected: wte.weight, h.0.ln_1.weight, ...)");
    return *t;
  };
  int layers = 0;
  while (sf.find("h." + std::to_string(layers) + ".ln_1.weight")) ++layers;
  if (layers == 0) throw file_error(in, "has no tensor 'h.0.ln_1.weight': not a GPT-2 model");
  const auto& wte = need("wte.weight");
  const auto& wpe = need("wpe.weight");
  model::GptConfig mc;
  mc.num_layers = layers;
  mc.hidden_size = dim_of(sf, wte, 1, "the hidden size", 1 << 20);
  mc.vocab_size = dim_of(sf, wte, 0, "the vocabulary", (1 << 30));
  mc.max_seq_length = dim_of(sf, wpe, 0, "the positions", 1 << 24);
  if (wpe.shape[1] != mc.hidden_size)
    throw file_error(in, "tensor wpe.weight has shape " + shape_string(wpe.shape) + ", wte.weight's hidden size is " +
                             std::to_string(mc.hidden_size));
  mc.num_heads = heads > 0 ? heads : std::max(1, mc.hidden_size / 64);
  mc.vocab_multiple = vocab_multiple;
  mc.validate();
  model::Gpt gpt(mc, kernels::Precision::fp32, false);
  const auto& layout = gpt.layout();
  // The shape GPT-2 stores each tensor with; every one is checked before anything is allocated,
  // so the model's size is bounded by the data the file really holds.
  auto theirs_of = [&](const NameMap& nm) {
    std::vector<int64_t> theirs = layout.find(nm.ours).shape;
    if (nm.transpose) std::swap(theirs[0], theirs[1]);
    if (nm.theirs == "wte.weight") theirs[0] = mc.vocab_size;  // pad rows stay zero
    return theirs;
  };
  for (const auto& nm : gpt2_names(layers)) {
    const auto& t = need(nm.theirs);
    if (t.dtype != "F32") throw file_error(in, "tensor " + nm.theirs + " is " + t.dtype + ", only F32 is read");
    if (t.shape != theirs_of(nm))
      throw file_error(in, "tensor " + nm.theirs + " has shape " + shape_string(t.shape) + ", this model needs " +
                               shape_string(theirs_of(nm)));
  }
  std::vector<float> params(layout.numel(), 0.0f), zeros(layout.numel(), 0.0f), zeros2(layout.numel(), 0.0f);
  for (const auto& nm : gpt2_names(layers)) {
    const auto& ts = layout.find(nm.ours);
    const std::vector<int64_t> theirs = theirs_of(nm);
    std::vector<float> x = sf.read_f32(nm.theirs, theirs);
    if (nm.transpose) x = transposed(x, theirs[0], theirs[1]);
    std::copy(x.begin(), x.end(), params.begin() + static_cast<std::ptrdiff_t>(ts.offset));
  }
  parallel::StatePiece piece;
  piece.begin = 0;
  piece.count = layout.numel();
  piece.params = params.data();
  piece.exp_avg = zeros.data();
  piece.exp_avg_sq = zeros2.data();
  engine::TrainingState st;
  engine::CheckpointMeta meta;
  meta.architecture = {{"model", "gpt"}, {"num_layers", mc.num_layers}, {"hidden_size", mc.hidden_size},
                       {"num_attention_heads", mc.num_heads}, {"seq_length", mc.max_seq_length},
                       {"padded_vocab_size", mc.padded_vocab()}};
  meta.config = {{"imported_from", in}, {"model", {{"vocab_size", mc.vocab_size}}}};
  meta.tokenizer = "unknown: imported from safetensors (GPT-2 names)";
  meta.layout = {{"world_size", 1}, {"dp", 1}, {"tp", 1}, {"ep", 1}, {"zero_stage", 0}};
  comm::Communicator self = comm::Communicator::self();
  engine::Checkpointer ck(self, dir, 0);
  std::string file = ck.save(engine::TensorSet::of(layout, {piece}), st, meta);
  std::printf("# %s: %s (%d layers, hidden %d, %d heads, seq %d, vocab %d) from %s\n", file.c_str(),
              format_bytes(4.0 * double(layout.numel())).c_str(), mc.num_layers, mc.hidden_size, mc.num_heads,
              mc.max_seq_length, mc.vocab_size, in.c_str());
  return 0;
}

int positive_int(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0 || x < 1 || x > (1 << 20))
    throw config_error(flag, flag + " expects an integer from 1 to 1048576, got '" + v + "'");
  return static_cast<int>(x);
}

int run(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << kHelp;
    return args.empty() ? 2 : 0;
  }
  const std::string cmd = args[0];
  if (cmd == "export") {
    if (args.size() != 3) throw config_error(cmd, "export needs PATH and OUT.safetensors", "see --help");
    return export_safetensors(args[1], args[2]);
  }
  if (cmd == "import") {
    if (args.size() < 3) throw config_error(cmd, "import needs IN.safetensors and DIR", "see --help");
    int heads = 0, mult = 128;
    for (size_t i = 3; i < args.size(); ++i) {
      if (args[i] == "--num-attention-heads" && i + 1 < args.size()) heads = positive_int(args[i], args[i + 1]), ++i;
      else if (args[i] == "--make-vocab-size-divisible-by" && i + 1 < args.size()) mult = positive_int(args[i], args[i + 1]), ++i;
      else throw config_error(args[i], "unknown argument '" + args[i] + "'", "see --help");
    }
    return import_safetensors(args[1], args[2], heads, mult);
  }
  if (cmd != "list" && cmd != "verify") throw config_error(cmd, "unknown command '" + cmd + "'", "use list, verify, export or import");
  if (args.size() < 2) throw config_error(cmd, "needs a checkpoint file or directory");
  std::string json_out;
  for (size_t i = 2; i < args.size(); ++i) {
    if (args[i] == "--json" && i + 1 < args.size()) json_out = args[++i];
    else throw config_error(args[i], "unknown argument '" + args[i] + "'", "see --help");
  }
  std::string file = engine::Checkpointer::resolve(args[1]);
  if (file.empty()) throw file_error(args[1], "no checkpoint here (no such file, or a directory without `latest`)");

  io::H5File f = io::H5File::open(file, io::H5File::Mode::read, MPI_COMM_SELF);
  if (cmd == "verify") {
    // Every check `pretrain_gpt --load` makes of the file itself: the run state (types, ranges,
    // its checksum) and the tensor set the stored architecture implies, shape by shape.
    model::GptConfig mc;
    engine::check_structure(f, file, &mc);
  }
  struct stat fst {};
  const uint64_t file_bytes = ::stat(file.c_str(), &fst) == 0 ? static_cast<uint64_t>(fst.st_size) : 0;
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
      if (4 * n > file_bytes) throw file_error(file, "tensor " + name + " declares more data than the file holds: the checkpoint is damaged");
      std::vector<float> buf(n);
      f.read(name, 0, buf.data(), n);
      uint64_t got = engine::Checkpointer::checksum(buf.data(), 0, n);
      state = !stored ? "MISSING" : got == *stored ? "OK" : "FAILED";
      if (state != "OK") failures.push_back(name + ": checksum " + state);
    }
    table.add_row({name, shape_string(shape), static_cast<int64_t>(n), state});
    tensors.push_back({{"name", name}, {"shape", shape}, {"elements", n}, {"checksum", state},
                       {"stored_checksum", stored ? nlohmann::json(std::to_string(*stored)) : nlohmann::json(nullptr)},
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
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "hpct_ckpt: error: out of memory (the file declares more data than fits)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hpct_ckpt: error: %s\n", e.what());
    return 1;
  }
}
