// Parallel HDF5 checkpoints (see checkpointer.hpp).
#include "hpct/engine/checkpoint/checkpointer.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <sys/statvfs.h>

#include "hpct/core/error.hpp"
#include "hpct/core/report.hpp"
#include "hpct/core/rng.hpp"
#include "hpct/core/units.hpp"
#include "hpct/engine/checkpoint/checkpoint_state.hpp"
#include "hpct/io/h5_file.hpp"

namespace hpct::engine {

namespace {

constexpr const char* kFormat = kCheckpointFormat;
const char* kGroups[3] = {"model", "optimizer/exp_avg", "optimizer/exp_avg_sq"};

// For each run of a full tensor inside piece p: f(group, tensor index, begin, end, pointer to
// element begin), with begin/end element indices of the full tensor (the dataset): a
// tensor-parallel part covers its slice in several runs. g: 0 params, 1 exp_avg, 2 exp_avg_sq;
// the first `groups` of them (1: the weights alone, a checkpoint without optimizer states).
template <class F>
void for_parts(const std::vector<TensorSpec>& tensors, const parallel::StatePiece& p, int groups, F&& f) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& ts = tensors[i];
    const size_t lo = std::max(p.begin, ts.offset), hi = std::min(p.begin + p.count, ts.offset + ts.numel);
    if (lo >= hi) continue;
    ts.for_full_runs(lo - ts.offset, hi - ts.offset, [&](uint64_t full, uint64_t local, uint64_t n) {
      for (int g = 0; g < groups; ++g) {
        float* base = g == 0 ? p.params : g == 1 ? p.exp_avg : p.exp_avg_sq;
        f(g, i, full, full + n, base + (ts.offset + local - p.begin));
      }
    });
  }
}

// Test-only: HPCT_FAULT_CKPT="<rank>:<point>[:<iteration>]" makes that rank die (SIGKILL) at that
// point of a save (of that iteration's checkpoint, or of any).
void maybe_fault(int rank, const char* point, long long iteration) {
  const char* spec = std::getenv("HPCT_FAULT_CKPT");
  if (!spec) return;
  std::vector<std::string> f;
  std::stringstream ss(spec);
  for (std::string x; std::getline(ss, x, ':');) f.push_back(x);
  if (f.size() < 2) return;
  bool at_iter = f.size() < 3 || std::atoll(f[2].c_str()) == iteration;
  if (std::atoi(f[0].c_str()) == rank && f[1] == point && at_iter) {
    std::fprintf(stderr, "[rank %d] HPCT_FAULT_CKPT: killing this rank at '%s' of a checkpoint save\n", rank, point);
    std::fflush(stderr);
    ::raise(SIGKILL);
  }
}

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) throw file_error(path, std::string("cannot open to fsync: ") + std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) throw file_error(path, std::string("fsync failed: ") + std::strerror(err));
}

// Writes `text` to dir/name atomically (tmp + fsync + rename + fsync dir).
void write_atomic(const std::string& dir, const std::string& name, const std::string& text) {
  std::string final_path = dir + "/" + name, tmp = final_path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << text;
    f.flush();
    if (!f) throw file_error(tmp, "cannot write (disk full?)");
  }
  fsync_path(tmp, false);
  if (std::rename(tmp.c_str(), final_path.c_str()) != 0)
    throw file_error(final_path, std::string("cannot rename into place: ") + std::strerror(errno));
  fsync_path(dir, true);
}

long long iteration_of(const std::string& name) {
  // iter_0000050.h5
  if (name.size() < 9 || name.rfind("iter_", 0) != 0 || name.substr(name.size() - 3) != ".h5") return -1;
  std::string digits = name.substr(5, name.size() - 8);
  if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::atoll(digits.c_str());
}

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) out.emplace_back(e->d_name);
    ::closedir(d);
  }
  return out;
}

// Rank 0, before any tensor data moves: makes sure the checkpoint fits. fallocate reserves the
// file's blocks (KEEP_SIZE: without moving the end of file HDF5 checks on open). Where the
// filesystem has no fallocate (ext2/3, NFSv3, some parallel filesystems) the free space is compared
// with the bytes to be written instead; a disk that still fills during the save fails the save
// cleanly on every rank (finish_save), with the previous checkpoint untouched.
void reserve_space(const std::string& tmp, const std::vector<TensorSpec>& tensors, const std::vector<uint64_t>& offsets) {
  uint64_t end = 0, data = 0;
  const size_t groups = tensors.empty() ? 0 : offsets.size() / tensors.size();  // 3, or 1 without optimizer states
  for (size_t g = 0; g < groups; ++g)
    for (size_t i = 0; i < tensors.size(); ++i) {
      end = std::max<uint64_t>(end, offsets[g * tensors.size() + i] + 4 * tensors[i].full_numel());
      data += 4 * tensors[i].full_numel();
    }
  const uint64_t slack = 256 << 10;  // the metadata written at close
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) throw file_error(tmp, std::string("cannot open to reserve space: ") + std::strerror(errno));
  int rc = ::fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(end + slack)) == 0 ? 0 : errno;
  struct statvfs v {};
  const bool have_free = ::fstatvfs(fd, &v) == 0;
  ::close(fd);
  const std::string hint = "free space on the checkpoint filesystem or lower --keep-last";
  if (rc == ENOSPC)
    throw file_error(tmp, "No space left on device: the checkpoint needs " + format_bytes(static_cast<double>(end + slack)), hint);
  if (rc != 0 && rc != EOPNOTSUPP && rc != EINVAL && rc != ENOSYS)
    throw file_error(tmp, std::string("cannot reserve space: ") + std::strerror(rc));
  // Test-only (docs/checkpoints.md): HPCT_TEST_SKIP_SPACE_CHECK=1 lets a save start on a disk too
  // small for it, to test a disk that fills during the save.
  const char* skip = std::getenv("HPCT_TEST_SKIP_SPACE_CHECK");
  if (rc != 0 && have_free && !(skip && std::string(skip) == "1")) {
    const uint64_t free_bytes = static_cast<uint64_t>(v.f_bavail) * v.f_frsize;
    if (free_bytes < data + slack)
      throw file_error(tmp, "No space left on device: the checkpoint needs " + format_bytes(static_cast<double>(data + slack)) +
                                ", the filesystem has " + format_bytes(static_cast<double>(free_bytes)) + " free", hint);
  }
}

}  // namespace

TensorSet TensorSet::of(const ParamLayout& layout, std::vector<parallel::StatePiece> pieces) {
  TensorSet t;
  t.layout = &layout;
  t.visit = [pieces = std::move(pieces)](bool, const PieceFn& fn) {
    for (const auto& p : pieces) fn(p);
  };
  return t;
}

std::string checkpoint_file_name(long long iteration) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "iter_%07lld.h5", iteration);
  return buf;
}

std::string Checkpointer::dataset_name(const std::string& group, const std::string& tensor) {
  std::string t = tensor;
  std::replace(t.begin(), t.end(), '.', '/');
  return "/" + group + "/" + t;
}

uint64_t Checkpointer::checksum_at(const float* first, uint64_t begin, uint64_t end) {
  uint64_t h = 0;
  for (uint64_t i = begin; i < end; ++i) {
    uint32_t bits;
    std::memcpy(&bits, first + (i - begin), 4);
    h += splitmix64(i * 0x100000001B3ull ^ bits);
  }
  return h;
}

void Checkpointer::check_checksum(const io::H5File& f, const std::string& name, uint64_t sum, const std::string& file) {
  auto want = f.attr_uint(name, "checksum");
  if (!want) throw file_error(file, "tensor " + name + " has no checksum attribute");
  if (*want != sum)
    throw file_error(file, "tensor " + name + " fails its checksum: the checkpoint is corrupt",
                     "load an earlier checkpoint (pass its file to --load)");
}

Checkpointer::Checkpointer(const comm::Communicator& world, std::string dir, int keep_last)
    : world_(world), dir_(std::move(dir)), keep_last_(keep_last) {}

std::string Checkpointer::resolve(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "";
  if (S_ISREG(st.st_mode)) return path;
  if (!S_ISDIR(st.st_mode)) throw file_error(path, "is neither a checkpoint file nor a directory");
  const std::string latest = path + "/latest";
  std::ifstream f(latest);
  if (!f) {
    // Checkpoints without `latest`: taking the directory as empty would start a fresh run whose
    // saves overwrite them. Refuse, naming the newest, rather than guess which one to trust.
    const std::string newest = newest_checkpoint_in(path);
    if (!newest.empty())
      throw file_error(path, "holds checkpoints (newest " + newest + ") but no `latest` file naming the one to resume",
                       "pass the checkpoint file to --load (--load " + path + "/" + newest + "), or write its name into " + latest);
    return "";
  }
  std::string name;
  std::getline(f, name, '\n');
  // `latest` names a file of this directory as the saver writes it (iter_0000050.h5): anything else
  // (a path, "..", a NUL) is refused instead of being joined to the directory.
  if (iteration_of(name) < 0)
    throw file_error(latest, "names '" + printable(name) + "', which is not a checkpoint file name of this directory (iter_NNNNNNN.h5)",
                     "write the name of a checkpoint in " + path + " into it, or pass a checkpoint file to --load");
  const std::string file = path + "/" + name;
  if (::stat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
    throw file_error(latest, "names checkpoint '" + name + "', which does not exist", "pass a checkpoint file to --load explicitly");
  return file;
}

void Checkpointer::make_directory(const std::string& dir) {
  std::string p;
  std::stringstream ss(dir);
  std::string part;
  if (!dir.empty() && dir[0] == '/') p = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    p += part + "/";
    if (::mkdir(p.c_str(), 0755) != 0 && errno != EEXIST)
      throw file_error(dir, "cannot create the checkpoint directory " + p + ": " + std::strerror(errno),
                       "choose a directory you can write");
  }
}

std::string Checkpointer::newest_checkpoint_in(const std::string& dir) {
  long long best = -1;
  std::string name;
  for (const auto& n : list_dir(dir))
    if (long long it = iteration_of(n); it > best) {
      best = it;
      name = n;
    }
  return name;
}

std::string Checkpointer::save(const TensorSet& t, const TrainingState& s, const CheckpointMeta& meta) {
  auto p = begin_save(*t.layout, s, meta);
  write_pieces(*p, t);
  return finish_save(*p);
}

std::unique_ptr<Checkpointer::PendingSave> Checkpointer::begin_save(const ParamLayout& layout, const TrainingState& s,
                                                                     const CheckpointMeta& meta) {
  const int rank = world_.rank();
  auto pending = std::make_unique<PendingSave>();
  PendingSave& ps = *pending;
  ps.iteration = s.iteration;
  ps.layout = &layout;
  ps.final_path = dir_ + "/" + checkpoint_file_name(s.iteration);
  ps.tmp = ps.final_path + ".tmp";
  const std::string& tmp = ps.tmp;
  const auto& tensors = layout.tensors();
  ps.groups = s.optimizer_saved ? 3 : 1;
  ps.sums.assign(ps.groups * tensors.size(), 0);
  ps.offsets.assign(ps.groups * tensors.size(), 0);

  // Rank 0 prepares the directory and clears leftovers of a save that died.
  std::string err;
  if (rank == 0) {
    err = comm::error_text_of([&] {
      make_directory(dir_);
      for (const auto& n : list_dir(dir_))
        if (n.size() > 4 && n.substr(n.size() - 4) == ".tmp") ::unlink((dir_ + "/" + n).c_str());
      // HDF5 creates the file through whatever the name is: a link that could not be removed
      // (another user's, in a sticky directory) would get its target truncated.
      struct stat lst {};
      if (::lstat(ps.tmp.c_str(), &lst) == 0)
        throw file_error(ps.tmp, "exists and cannot be removed", "remove it (another user's file?) or save to another directory");
    });
  }
  comm::throw_if_any(world_, err);

  // Rank 0 alone writes the HDF5 structure (datasets, attributes) through its own handle; every
  // rank writes its tensor bytes straight to the datasets' offsets (write_pieces). No HDF5 call is
  // collective, so a failure on any rank (a full disk, EIO) is agreed on by our own all-reduces and
  // can never leave ranks waiting inside HDF5 for one that has given up.
  if (rank == 0) {
    err = comm::error_text_of([&] {
      ps.file = io::H5File::open(tmp, io::H5File::Mode::create, MPI_COMM_SELF);
      io::H5File& f = ps.file;
      for (int g = 0; g < ps.groups; ++g)
        for (size_t i = 0; i < tensors.size(); ++i) f.create_dataset(dataset_name(kGroups[g], tensors[i].name), tensors[i].shape);
      f.set_attr("/", "format", std::string(kFormat));
      f.set_attr("/", "iteration", static_cast<int64_t>(s.iteration));
      f.set_attr("/", "consumed_samples", static_cast<int64_t>(s.consumed_samples));
      if (s.consumed_tokens >= 0) f.set_attr("/", "consumed_tokens", static_cast<int64_t>(s.consumed_tokens));
      if (s.consumed_layer_tokens >= 0)
        f.set_attr("/", "consumed_layer_tokens", static_cast<int64_t>(s.consumed_layer_tokens));
      f.set_attr("/", "optimizer_step", static_cast<int64_t>(s.adam_step));
      if (s.adam_step_base != 0) f.set_attr("/", "optimizer_step_base", static_cast<int64_t>(s.adam_step_base));
      f.set_attr("/", "skipped_iterations", static_cast<int64_t>(s.skipped_iterations));
      f.set_attr("/", "nan_iterations", static_cast<int64_t>(s.nan_iterations));
      if (!s.optimizer_saved) f.set_attr("/", "optimizer_states", std::string("none"));
      f.set_attr("/", "loss_scaler", json_text(s.loss_scaler));
      f.set_attr("/", "config", json_text(meta.config));
      f.set_attr("/", "architecture", json_text(meta.architecture));
      f.set_attr("/", "tokenizer", meta.tokenizer);
      f.set_attr("/", "parallel_layout", json_text(meta.layout));
      f.set_attr("/", "seed", static_cast<uint64_t>(meta.seed));
      f.set_attr("/", "software", std::string("hpctrain ") + hpct_version() + " (git " + hpct_git_sha() + ")");
      f.set_attr("/", "rng", std::string("no random state is consumed during training: data order, initialisation, "
                                         "dropout masks and routing noise are pure functions of 'seed' and the sample index"));
      f.set_attr("/", "run_state_checksum", run_state_checksum(s, meta));
      for (int g = 0; g < ps.groups; ++g)
        for (size_t i = 0; i < tensors.size(); ++i)
          ps.offsets[g * tensors.size() + i] = f.dataset_file_offset(dataset_name(kGroups[g], tensors[i].name));
      reserve_space(tmp, tensors, ps.offsets);
    });
    if (!err.empty()) {
      ps.file = io::H5File();  // closed here: on MPI_COMM_SELF a close is local and cannot hang
      ::unlink(tmp.c_str());
    }
  }
  comm::throw_if_any(world_, err);
  // Where each dataset's bytes live: the data phase writes them without HDF5 (any thread).
  HPCT_CHECK_MPI(MPI_Bcast(ps.offsets.data(), static_cast<int>(ps.offsets.size()), MPI_UINT64_T, 0, world_.raw()));
  return pending;
}

void Checkpointer::write_pieces(PendingSave& ps, const TensorSet& t) {
  const auto& tensors = ps.layout->tensors();
  ps.error = comm::error_text_of([&] {
    io::RawFile w(ps.tmp, io::RawFile::Access::write);
    t.visit(false, [&](const parallel::StatePiece& p) {
      for_parts(tensors, p, ps.groups, [&](int g, size_t i, uint64_t b, uint64_t e, const float* x) {
        if (!tensors[i].primary()) return;  // a tensor-parallel replica: its primary copy's rank writes it
        const size_t k = g * tensors.size() + i;
        w.write(ps.offsets[k] + b * sizeof(float), x, (e - b) * sizeof(float),
                std::to_string(e - b) + " elements of " + dataset_name(kGroups[g], tensors[i].name));
        ps.sums[k] += checksum_at(x, b, e);
      });
    });
    w.sync();  // on stable storage before the (collective) close
  });
  ps.written.store(true);
}

bool Checkpointer::written(const PendingSave& ps) { return ps.written.load(); }

std::string Checkpointer::finish_save(PendingSave& ps) {
  const int rank = world_.rank();
  const auto& tensors = ps.layout->tensors();
  const std::string& tmp = ps.tmp;
  const std::string& final_path = ps.final_path;
  std::string err = ps.error;
  maybe_fault(rank, "after_tensors", ps.iteration);
  HPCT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, ps.sums.data(), static_cast<int>(ps.sums.size()), MPI_UINT64_T, MPI_SUM,
                               world_.raw()));
  // Every rank's data is on stable storage (or its failure known) before rank 0 closes the file.
  const bool data_ok = comm::all_ok(world_, err.empty());
  if (rank == 0) {
    io::H5File f = std::move(ps.file);
    if (data_ok) {
      err = comm::error_text_of([&] {
        std::vector<TensorChecksum> bound;
        for (int g = 0; g < ps.groups; ++g)
          for (size_t i = 0; i < tensors.size(); ++i) {
            const std::string name = dataset_name(kGroups[g], tensors[i].name);
            f.set_attr(name, "checksum", ps.sums[g * tensors.size() + i]);
            bound.push_back({name, tensors[i].shape, ps.sums[g * tensors.size() + i]});
          }
        f.set_attr("/", "tensor_checksums", tensor_set_digest(std::move(bound)));
        f.close();
      });
    }
    if (!data_ok || !err.empty()) {
      if (data_ok) f.abandon();  // its close failed already; a second would write again
      ::unlink(tmp.c_str());
    }  // otherwise f closes here (local: rank 0's own handle), releasing HDF5's and MPI-IO's file
  }
  if (!comm::all_ok(world_, err.empty())) comm::throw_if_any(world_, err);

  // Publish: fsync, rename, fsync dir; then `latest`; then prune. Rank 0 alone touches names.
  if (rank == 0) {
    err = comm::error_text_of([&] {
      fsync_path(tmp, false);
      maybe_fault(rank, "before_rename", ps.iteration);
      if (std::rename(tmp.c_str(), final_path.c_str()) != 0)
        throw file_error(final_path, std::string("cannot rename the finished checkpoint into place: ") + std::strerror(errno));
      fsync_path(dir_, true);
      maybe_fault(rank, "before_latest", ps.iteration);
      write_atomic(dir_, "latest", checkpoint_file_name(ps.iteration) + "\n");
      if (keep_last_ > 0) {
        std::vector<std::pair<long long, std::string>> all;
        for (const auto& n : list_dir(dir_))
          if (long long it = iteration_of(n); it >= 0) all.emplace_back(it, n);
        std::sort(all.begin(), all.end());
        for (size_t i = 0; i + static_cast<size_t>(keep_last_) < all.size(); ++i)
          if (all[i].first != ps.iteration) ::unlink((dir_ + "/" + all[i].second).c_str());
      }
    });
    if (!err.empty()) ::unlink(tmp.c_str());
  }
  comm::throw_if_any(world_, err);
  return final_path;
}

void Checkpointer::load(const std::string& file, const TensorSet& t, TrainingState& s, const CheckpointMeta& meta,
                        bool need_moments) const {
  const auto& tensors = t.layout->tensors();
  io::H5File f = io::H5File::open(file, io::H5File::Mode::read, world_.raw());

  // Identity, run state and architecture, checked alike on every rank (collective metadata reads):
  // the same checks `hpct_ckpt verify` runs.
  StoredRun stored;
  std::string err = comm::error_text_of([&] {
    stored = read_stored_run(f, file);
    if (!stored.state.optimizer_saved && need_moments)
      throw file_error(file, "holds no optimizer states (it was saved with --no-save-optim)",
                       "resume with --no-load-optim (fresh Adam moments), or start from its weights with --finetune");
    check_tensor_set(f, *t.layout, file, stored.state.optimizer_saved ? 3 : 1);  // the first tensor that differs, with both shapes
    check_compatible(stored, meta, file);
  });
  comm::throw_if_any(world_, err);
  const int groups = stored.state.optimizer_saved ? 3 : 1;

  // Data: each rank reads the ranges it owns and checksums them (the caller re-replicates).
  std::vector<uint64_t> sums(groups * tensors.size(), 0);
  err = comm::error_text_of([&] {
    t.visit(true, [&](const parallel::StatePiece& p) {
      for_parts(tensors, p, groups, [&](int g, size_t i, uint64_t b, uint64_t e, float* x) {
        f.read(dataset_name(kGroups[g], tensors[i].name), b, x, e - b);
        if (tensors[i].primary()) sums[g * tensors.size() + i] += checksum_at(x, b, e);  // each element once
      });
    });
  });
  comm::throw_if_any(world_, err);
  HPCT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, sums.data(), static_cast<int>(sums.size()), MPI_UINT64_T, MPI_SUM, world_.raw()));
  err = comm::error_text_of([&] {
    for (int g = 0; g < groups; ++g)
      for (size_t i = 0; i < tensors.size(); ++i) {
        check_checksum(f, dataset_name(kGroups[g], tensors[i].name), sums[g * tensors.size() + i], file);
      }
    s = stored.state;
  });
  comm::throw_if_any(world_, err);
  f.close();
}

}  // namespace hpct::engine
