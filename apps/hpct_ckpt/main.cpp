// hpct_ckpt — lists and verifies hpctrain checkpoints (one process; no MPI launcher needed).
// Thin: resolve the file (a directory's `latest`), read attributes and datasets through
// hpct::io::H5File, recompute each dataset's checksum with the checkpointer's definition.
// export writes a GPT checkpoint's weights as safetensors with the GPT-2 (Hugging Face) tensor
// names and layouts, or a Llama-shaped one's as LlamaForCausalLM's; import turns such files into a
// checkpoint at iteration 0 (Adam moments zero) that pretrain_gpt --load continues from.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <new>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "hpct/comm/mpi.hpp"
#include "hpct/core/cli.hpp"
#include "hpct/core/error.hpp"
#include "hpct/core/file.hpp"
#include "hpct/core/json_config.hpp"
#include "hpct/core/report.hpp"
#include "hpct/core/units.hpp"
#include "hpct/engine/checkpoint/checkpoint_state.hpp"
#include "hpct/engine/checkpoint/checkpointer.hpp"
#include "hpct/engine/checkpoint/tokenizer_identity.hpp"
#include "hpct/io/tokenizer.hpp"
#include "hpct/io/h5_file.hpp"
#include "hpct/engine/checkpoint/hf_gpt2.hpp"
#include "hpct/engine/checkpoint/hf_llama.hpp"
#include "hpct/engine/config/preflight.hpp"
#include "hpct/engine/checkpoint/lora.hpp"
#include "hpct/io/safetensors.hpp"
#include "hpct/model/gpt.hpp"

using namespace hpct;

namespace {

const char* kHelp = R"(usage: hpct_ckpt list|verify PATH [--json FILE]
       hpct_ckpt export PATH OUT.safetensors [--force]
       hpct_ckpt import IN DIR [--num-attention-heads N] [--make-vocab-size-divisible-by M]
       hpct_ckpt merge-lora ADAPTERS DIR --base CKPT | --base-hf HFDIR

PATH is a checkpoint file (iter_0000050.h5) or a --save directory (its `latest` is used).
  list     the run state and provenance attributes and every tensor with its shape
  verify   every check `pretrain_gpt --load` makes of the file: the run state (present, in range,
           its checksum), every tensor the stored architecture needs with its shape and no other,
           and every tensor's checksum recomputed (exit 1 at the first problem, named)
  export   the model weights as safetensors with GPT-2's names (wte.weight, h.0.attn.c_attn.weight,
           ...; linear weights as (in, out), as GPT-2's Conv1D stores them; the vocabulary
           padding rows dropped), fp32; beside it config.json and the run's tokenizer files as
           vocab.json and merges.txt (tokenizer.model, tokenizer.json for the SentencePiece and
           HFTokenizer types): name it DIR/model.safetensors and Hugging Face's
           GPT2LMHeadModel.from_pretrained(DIR) opens DIR. A Llama-shaped model (RMSNorm,
           SwiGLU, rotary positions, no biases) is written with LlamaForCausalLM's names
           (model.layers.N.self_attn.q_proj.weight, ...) and config.json instead
  import   GPT-2 or Llama weights in Hugging Face's layout into DIR/iter_0000000.h5 + DIR/latest,
           Adam moments zero; `pretrain_gpt --load DIR` then continues from those weights. IN is a
           save_pretrained directory (model.safetensors or its shards + config.json, and its
           tokenizer if there: vocab.json + merges.txt, else tokenizer.model as Llama2Tokenizer,
           else tokenizer.json as HFTokenizer; generate finds it) or a bare .safetensors file; names with or without
           "transformer.", F32, F16 or BF16. A bare file has no head count: --num-attention-heads
           (default hidden/64, GPT-2's)
  merge-lora  a --lora-rank run's checkpoint (ADAPTERS: its adapters only) folded into the base
           model it started from (--base: a checkpoint; --base-hf: Hugging Face GPT-2 weights, as
           --load-hf): W + (alpha / rank) B A for every adapted linear, written as DIR/iter_0000000.h5
           + DIR/latest, Adam moments zero, with the LoRA run's config and tokenizer; generate,
           export and finetune --load then take DIR as any whole model
  --json FILE   the same as JSON
  --version     version and git commit; @FILE stands for the flags written in FILE
Exit status: 0 fine, 1 a tensor fails its checksum or the file cannot be read, 2 usage.
)";

int export_safetensors(const std::string& path, const std::string& out, bool force) {
  std::string file = engine::Checkpointer::resolve(path);
  if (file.empty()) throw file_error(path, "no checkpoint here (no such file, or a directory without `latest`)");
  io::H5File f = io::H5File::open(file, io::H5File::Mode::read, MPI_COMM_SELF);
  // The structure verify checks, before any tensor is read: run state, architecture, tensor set.
  model::GptConfig mc;
  const engine::StoredRun stored = engine::check_structure(f, file, &mc);
  // A LoRA run's checkpoint holds its adapters only: Hugging Face gets the merged model.
  if (mc.lora.enabled())
    throw file_error(file, "holds LoRA adapters only (rank " + std::to_string(mc.lora.rank) + ", " + mc.lora.target_list() +
                               "), not a whole model",
                     "merge them into their base first: hpct_ckpt merge-lora " + path + " DIR --base BASE, then export DIR");
  // A Llama-shaped model is written as LlamaForCausalLM, any other as GPT2LMHeadModel; what neither
  // can hold is refused before anything is written.
  const std::string not_llama = engine::hf_llama_unfit(mc);
  const bool llama = not_llama.empty();
  auto refuse = [&](const std::string& not_gpt2) {
    throw file_error(file, "cannot be exported: not as GPT-2 (" + not_gpt2 + ") and not as Llama (" + not_llama + ")");
  };
  // Nothing already there is overwritten unless asked: a previous export (or a hub download) may be
  // what the user means to keep. Every file this export would write is checked before any is.
  if (!force) {
    const std::filesystem::path dir = std::filesystem::path(out).parent_path().empty() ? "." : std::filesystem::path(out).parent_path();
    std::vector<std::string> there;
    std::error_code ec;
    // a link counts, dangling or not: it is what would be replaced
    auto there_now = [&](const std::filesystem::path& p) { return std::filesystem::exists(std::filesystem::symlink_status(p, ec)); };
    if (there_now(out)) there.push_back(out);
    for (const char* name : {"config.json", "vocab.json", "merges.txt", "tokenizer.model", "tokenizer.json"})
      if (there_now(dir / name)) there.push_back((dir / name).string());
    if (!there.empty()) {
      std::string list;
      for (const auto& t : there) list += (list.empty() ? "" : ", ") + t;
      throw config_error("--force", "export would overwrite " + list, "export into an empty directory, or add --force");
    }
  }
  if (!llama) {
    if (mc.normalization != model::NormKind::layernorm) refuse("its norms are " + std::string(model::norm_name(mc.normalization)));
    if (mc.mlp != model::MlpKind::gelu) refuse("its MLPs are SwiGLU");
    if (!mc.linear_bias) refuse("its linears have no biases");
    if (mc.kv_heads() != mc.num_heads) refuse("it has grouped-query attention");
    if (mc.rotary) refuse("its positions are rotary");
    if (mc.untie_embeddings) refuse("its output layer is not the word embedding");
    if (mc.moe.enabled(mc.num_layers)) refuse("it has mixture-of-experts layers");
  }
  const auto& cfg = stored.meta.config;
  const int layers = mc.num_layers;
  if (!cfg.contains("model") || !cfg["model"].is_object() || !cfg["model"].contains("vocab_size") ||
      !cfg["model"]["vocab_size"].is_number_integer() || cfg["model"]["vocab_size"].get<int64_t>() < 1 ||
      cfg["model"]["vocab_size"].get<int64_t>() > mc.vocab_size)
    throw file_error(file, "has no config.model.vocab_size in 1.." + std::to_string(mc.vocab_size) + " (the padded vocabulary)");
  const int64_t vocab = cfg["model"]["vocab_size"].get<int64_t>();
  // One of our tensors whole, its checksum checked.
  auto ours = [&](const std::string& name, std::vector<int64_t>* shape_out) {
    const std::string ds = engine::Checkpointer::dataset_name("model", name);
    const auto shape = f.dataset_shape(ds);
    uint64_t n = 1;
    for (auto d : shape) n *= static_cast<uint64_t>(d);
    std::vector<float> x(n);
    f.read(ds, 0, x.data(), n);
    engine::Checkpointer::check_checksum(f, ds, engine::Checkpointer::checksum(x.data(), 0, n), file);
    if (shape_out) *shape_out = shape;
    return x;
  };
  std::vector<engine::HfTensor> tensors;
  if (llama) {
    tensors = engine::hf_llama_tensors(mc, vocab, [&](const std::string& n) { return ours(n, nullptr); });
  } else {
    for (const auto& nm : engine::gpt2_names(layers)) {
      std::vector<int64_t> shape;
      std::vector<float> x = ours(nm.ours, &shape);
      if (nm.theirs == "wte.weight") {  // drop the padding rows
        x.resize(static_cast<size_t>(vocab * shape[1]));
        shape[0] = vocab;
      }
      if (nm.transpose) {
        x = engine::transposed(x, shape[0], shape[1]);
        std::swap(shape[0], shape[1]);
      }
      tensors.push_back({nm.theirs, shape, std::move(x)});
    }
  }
  nlohmann::json header = {{"__metadata__", {{"format", "pt"}, {"source", file}, {"software", hpct_version()}}}};
  uint64_t off = 0;
  for (const auto& t : tensors) {
    const uint64_t bytes = t.data.size() * sizeof(float);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
  }
  f.close();
  std::string h = json_text(header);
  while ((8 + h.size()) % 8) h.push_back(' ');  // data starts 8-byte aligned
  write_file_atomic(out, [&](std::FILE* o) {
    const uint64_t hl = h.size();
    std::fwrite(&hl, 8, 1, o);  // little-endian (x86, aarch64)
    std::fwrite(h.data(), 1, h.size(), o);
    for (const auto& t : tensors) std::fwrite(t.data.data(), sizeof(float), t.data.size(), o);
  });
  std::printf("# %s: %zu tensors, %s, %s names, from %s\n", out.c_str(), tensors.size(), format_bytes(double(off)).c_str(),
              llama ? "Llama" : "GPT-2", file.c_str());
  // Beside it, what Hugging Face's from_pretrained reads with model.safetensors: config.json, and
  // the run's tokenizer files under Hugging Face's names.
  const std::filesystem::path dir = std::filesystem::path(out).parent_path().empty() ? "." : std::filesystem::path(out).parent_path();
  model::GptConfig hc = mc;
  hc.vocab_size = static_cast<int>(vocab);
  if (llama) {
    write_json_file((dir / "config.json").string(), engine::hf_llama_config(hc, vocab));
    std::printf("# %s: Llama config (num_hidden_layers %d, hidden_size %d, num_attention_heads %d, num_key_value_heads %d, "
                "vocab_size %lld)\n",
                (dir / "config.json").c_str(), hc.num_layers, hc.hidden_size, hc.num_heads, hc.kv_heads(),
                static_cast<long long>(vocab));
  } else {
    write_json_file((dir / "config.json").string(), engine::hf_gpt2_config(hc, static_cast<int>(vocab)));
    std::printf("# %s: GPT-2 config (n_layer %d, n_embd %d, n_head %d, n_positions %d, vocab_size %lld)\n",
                (dir / "config.json").c_str(), hc.num_layers, hc.hidden_size, hc.num_heads, hc.positions(),
                static_cast<long long>(vocab));
  }
  // The tokenizer files the config names are copied, under the names Hugging Face reads, only when
  // they are regular files of bounded size holding the bytes the run was trained with: the config
  // is anyone's to edit, and an export is meant to be published.
  const io::TokenizerSpec spec = engine::stored_tokenizer_spec(cfg);
  for (const auto& [which, src] : io::tokenizer_files(spec)) {
    if (src.empty()) continue;
    const char* name = which == "vocab" ? "vocab.json" : which == "merges" ? "merges.txt"
                     : which == "model" ? "tokenizer.model" : "tokenizer.json";
    const std::string dst = (dir / name).string();
    std::string why, bytes;
    try {
      bytes = read_regular_file(src, "the run's tokenizer " + which + " file", io::kMaxTokenizerFileBytes);
      why = engine::tokenizer_file_problem(stored.meta.tokenizer, which, src, bytes);
    } catch (const Error& e) {
      why = src + ": " + e.message();
    }
    if (!why.empty()) {
      std::printf("# %s not copied: %s\n", name, why.c_str());
      continue;
    }
    write_file_atomic(dst, bytes);
    std::printf("# %s: the run's %s (%s)\n", dst.c_str(), name, spec.type.c_str());
  }
  return 0;
}

int import_safetensors(const std::string& in, const std::string& dir, int heads, int vocab_multiple) {
  // One loader for every app (engine/hf_gpt2.hpp): names with or without "transformer.", F32/F16/
  // BF16, config.json where `in` is a save_pretrained directory; every tensor checked before use.
  engine::require_no_checkpoints(dir, "import");
  engine::HfGpt2 hf = engine::read_hf_gpt2(in, vocab_multiple, heads);
  const model::GptConfig& mc = hf.cfg;
  const ParamLayout layout = model::Gpt::layout_for(mc);
  std::vector<float>& params = hf.params;
  std::vector<float> zeros(layout.numel(), 0.0f), zeros2(layout.numel(), 0.0f);
  parallel::StatePiece piece;
  piece.begin = 0;
  piece.count = layout.numel();
  piece.params = params.data();
  piece.exp_avg = zeros.data();
  piece.exp_avg_sq = zeros2.data();
  engine::TrainingState st;
  engine::CheckpointMeta meta;
  meta.architecture = engine::architecture_of(mc);
  meta.config = {{"imported_from", in}, {"model", {{"vocab_size", mc.vocab_size}}}};
  meta.tokenizer = "unknown: imported from safetensors (GPT-2 names)";
  if (hf.tokenizer) {  // the directory's tokenizer files: generate finds them there
    meta.config["tokenizer_type"] = hf.tokenizer->type;
    if (!hf.tokenizer->model.empty()) meta.config["tokenizer_model"] = hf.tokenizer->model;
    if (!hf.tokenizer->vocab_file.empty()) meta.config["vocab_file"] = hf.tokenizer->vocab_file;
    if (!hf.tokenizer->merge_file.empty()) meta.config["merge_file"] = hf.tokenizer->merge_file;
    meta.tokenizer = engine::tokenizer_identity(*hf.tokenizer);
  }
  meta.layout = {{"world_size", 1}, {"dp", 1}, {"tp", 1}, {"ep", 1}, {"zero_stage", 0}};
  comm::Communicator self = comm::Communicator::self();
  engine::Checkpointer ck(self, dir, 0);
  std::string file = ck.save(engine::TensorSet::of(layout, {piece}), st, meta);
  std::printf("# %s: %s (%d layers, hidden %d, %d heads, %d positions, vocab %d) from %s\n", file.c_str(),
              format_bytes(4.0 * double(layout.numel())).c_str(), mc.num_layers, mc.hidden_size, mc.num_heads,
              mc.max_seq_length, mc.vocab_size, in.c_str());
  return 0;
}

int merge_lora(const std::string& adapters, const std::string& dir, const std::string& base, const std::string& base_hf) {
  if (base.empty() == base_hf.empty())
    throw config_error("--base", "merge-lora needs the base model: --base CKPT or --base-hf DIR (one of them)", "see --help");
  engine::require_no_checkpoints(dir, "merge-lora");
  const engine::CheckpointWeights a = engine::read_checkpoint_weights(adapters, /*adapters=*/true);
  model::GptConfig mc;
  std::vector<float> params;
  std::string from;
  if (!base.empty()) {
    engine::CheckpointWeights b = engine::read_checkpoint_weights(base);
    mc = b.cfg, params = std::move(b.params), from = b.file;
  } else {
    engine::HfGpt2 hf = engine::read_hf_gpt2(base_hf, 1);
    mc = hf.cfg, params = std::move(hf.params), from = hf.file;
  }
  const char* flag = base.empty() ? "--base-hf" : "--base";
  // The adapters' run padded the vocabulary and sized the position table: the base must have both.
  if (mc.padded_vocab() != a.cfg.padded_vocab() || mc.positions() != a.cfg.positions())
    throw config_error(flag, from + " has a vocabulary of " + std::to_string(mc.padded_vocab()) + " rows and " +
                                 std::to_string(mc.positions()) + " positions; the adapters' model " +
                                 std::to_string(a.cfg.padded_vocab()) + " and " + std::to_string(a.cfg.positions()),
                       "give the base model the LoRA run started from");
  engine::merge_lora(a.cfg, a.params, mc, params, flag);
  const ParamLayout layout = model::Gpt::layout_for(mc);
  // Fresh checksums would certify whatever is written: a NaN or inf from the adapters or the base
  // is refused here, naming the tensor, instead of laundered into a file that verifies.
  for (const auto& t : layout.tensors())
    for (size_t i = 0; i < t.numel; ++i)
      if (!std::isfinite(params[t.offset + i]))
        throw file_error(a.file, "merging gives a non-finite value in " + t.name + " (element " + std::to_string(i) +
                                     "): the adapters or the base weights are not finite",
                         "merge adapters of a run whose loss stayed finite");
  std::vector<float> zeros(layout.numel(), 0.0f), zeros2(layout.numel(), 0.0f);
  parallel::StatePiece piece;
  piece.count = layout.numel();
  piece.params = params.data();
  piece.exp_avg = zeros.data();
  piece.exp_avg_sq = zeros2.data();
  engine::TrainingState st;
  engine::CheckpointMeta meta = a.stored.meta;  // the LoRA run's config, tokenizer and seed
  meta.architecture = engine::architecture_of(mc);
  meta.config.erase("lora_base");
  meta.config["merged_lora"] = {{"adapters", a.file}, {"base", from}, {"rank", a.cfg.lora.rank},
                                {"alpha", a.cfg.lora.alpha}, {"targets", a.cfg.lora.target_list()}};
  meta.layout = {{"world_size", 1}, {"dp", 1}, {"tp", 1}, {"ep", 1}, {"zero_stage", 0}};
  comm::Communicator self = comm::Communicator::self();
  std::string file = engine::Checkpointer(self, dir, 0).save(engine::TensorSet::of(layout, {piece}), st, meta);
  std::printf("# %s: %s base with rank-%d adapters (alpha %g on %s) merged: %s + %s\n", file.c_str(),
              format_bytes(4.0 * double(layout.numel())).c_str(), a.cfg.lora.rank, a.cfg.lora.alpha,
              a.cfg.lora.target_list().c_str(), from.c_str(), a.file.c_str());
  return 0;
}

int run(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::cout << kHelp;
    return 2;
  }
  std::string cmd, path, out, json_out, base, base_hf;
  int heads = 0, mult = 128;
  bool force = false;
  cli::Parser p("hpct_ckpt");
  p.positional("COMMAND", [&](const std::string& v) { cmd = v; }, true);
  p.positional("PATH", [&](const std::string& v) { path = v; }, true);
  p.positional("OUT", [&](const std::string& v) { out = v; }, false);
  p.flag("--json", 1, [&](const std::string& v) { json_out = v; });
  p.flag("--base", 1, [&](const std::string& v) { base = v; });
  p.flag("--base-hf", 1, [&](const std::string& v) { base_hf = v; });
  p.flag("--force", 0, [&](const std::string&) { force = true; });
  p.flag("--num-attention-heads", 1,
         [&](const std::string& v) { heads = (int)cli::to_int("--num-attention-heads", v, 1, 1 << 20); });
  p.flag("--make-vocab-size-divisible-by", 1,
         [&](const std::string& v) { mult = (int)cli::to_int("--make-vocab-size-divisible-by", v, 1, 1 << 20); });
  if (!p.parse(args)) {
    std::cout << kHelp;
    return 0;
  }
  auto only_for = [&](const char* flag, std::initializer_list<const char*> cmds) {
    if (!p.was_given(flag)) return;
    for (const char* c : cmds)
      if (cmd == c) return;
    throw config_error(flag, cmd + " takes no " + flag, "see --help");
  };
  if (cmd != "list" && cmd != "verify" && cmd != "export" && cmd != "import" && cmd != "merge-lora")
    throw config_error(cmd, "unknown command '" + printable(cmd) + "'", "use list, verify, export, import or merge-lora");
  only_for("--base", {"merge-lora"});
  only_for("--base-hf", {"merge-lora"});
  only_for("--json", {"list", "verify"});
  only_for("--num-attention-heads", {"import"});
  only_for("--make-vocab-size-divisible-by", {"import"});
  only_for("--force", {"export"});
  if (cmd == "export") {
    if (out.empty()) throw config_error(cmd, "export needs PATH and OUT.safetensors", "see --help");
    return export_safetensors(path, out, force);
  }
  if (cmd == "merge-lora") {
    if (out.empty()) throw config_error(cmd, "merge-lora needs ADAPTERS and DIR", "see --help");
    return merge_lora(path, out, base, base_hf);
  }
  if (cmd == "import") {
    if (out.empty()) throw config_error(cmd, "import needs IN.safetensors and DIR", "see --help");
    return import_safetensors(path, out, heads, mult);
  }
  if (!out.empty()) throw config_error(out, "unexpected value '" + printable(out) + "'", "see --help");
  std::string file = engine::Checkpointer::resolve(path);
  if (file.empty()) throw file_error(path, "no checkpoint here (no such file, or a directory without `latest`)");

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
                       {"offset", f.contiguous_offset(name) ? nlohmann::json(*f.contiguous_offset(name)) : nlohmann::json(nullptr)}});
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
  if (hpct::print_version_if_asked("hpct_ckpt", argc, argv)) return 0;
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
