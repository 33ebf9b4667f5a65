#include "hpct/comm/mpi.hpp"

#include <climits>
#include <cstring>

namespace hpct::comm {

void throw_mpi_error(int rc, const char* call, const char* file, int line) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, buf, &len);
  throw Error(std::string("MPI error: ") + std::string(buf, len) + " [" + call + " at " + file + ":" +
              std::to_string(line) + "]");
}

Environment::Environment(int* argc, char*** argv, Threads threads) {
  int provided = 0;
  HPCT_CHECK_MPI(MPI_Init_thread(argc, argv, threads == Threads::single ? MPI_THREAD_SINGLE : MPI_THREAD_FUNNELED,
                                 &provided));
  // Errors come back as return codes so HPCT_CHECK_MPI can turn them into one clear line.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  set_error_rank(rank);
}

Environment::~Environment() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void Environment::abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

Communicator::Communicator(MPI_Comm c, bool owned) : comm_(c), owned_(owned) {
  if (comm_ != MPI_COMM_NULL) {
    HPCT_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
    HPCT_CHECK_MPI(MPI_Comm_size(comm_, &size_));
  }
}

Communicator Communicator::world() { return Communicator(MPI_COMM_WORLD, false); }
Communicator Communicator::self() { return Communicator(MPI_COMM_SELF, false); }

Communicator::Communicator(Communicator&& o) noexcept
    : comm_(o.comm_), owned_(o.owned_), rank_(o.rank_), size_(o.size_) {
  o.comm_ = MPI_COMM_NULL;
  o.owned_ = false;
}

Communicator& Communicator::operator=(Communicator&& o) noexcept {
  if (this != &o) {
    if (owned_ && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
    comm_ = o.comm_;
    owned_ = o.owned_;
    rank_ = o.rank_;
    size_ = o.size_;
    o.comm_ = MPI_COMM_NULL;
    o.owned_ = false;
  }
  return *this;
}

Communicator::~Communicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owned_ && comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

Communicator Communicator::split(int color, int key) const {
  MPI_Comm out;
  HPCT_CHECK_MPI(MPI_Comm_split(comm_, color, key, &out));
  MPI_Comm_set_errhandler(out, MPI_ERRORS_RETURN);
  return Communicator(out, true);
}

namespace {
// f(the communicator of the ranks of comm that share this rank's node), freed afterwards.
template <class F>
int with_node_comm(MPI_Comm comm, int rank, F&& f) {
  MPI_Comm local;
  HPCT_CHECK_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local));
  int v = 0;
  f(local, &v);
  MPI_Comm_free(&local);
  return v;
}
}  // namespace

int Communicator::node_local_rank() const { return with_node_comm(comm_, rank_, MPI_Comm_rank); }

int Communicator::node_local_size() const { return with_node_comm(comm_, rank_, MPI_Comm_size); }

void Communicator::barrier() const { HPCT_CHECK_MPI(MPI_Barrier(comm_)); }

// Large buffers are reduced in chunks below INT_MAX elements (MPI counts are int).
template <typename T>
static void allreduce_chunked(MPI_Comm comm, T* data, size_t n, MPI_Datatype type, MPI_Op op = MPI_SUM) {
  const size_t chunk = size_t(1) << 30;
  for (size_t off = 0; off < n; off += chunk) {
    int cnt = static_cast<int>(std::min(chunk, n - off));
    HPCT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, data + off, cnt, type, op, comm));
  }
}

void Communicator::allreduce_sum(float* data, size_t n) const {
  if (size_ > 1) allreduce_chunked(comm_, data, n, MPI_FLOAT);
}
void Communicator::allreduce_sum(double* data, size_t n) const {
  if (size_ > 1) allreduce_chunked(comm_, data, n, MPI_DOUBLE);
}
void Communicator::allreduce_max(float* data, size_t n) const {
  if (size_ > 1) allreduce_chunked(comm_, data, n, MPI_FLOAT, MPI_MAX);
}

void Communicator::alltoall(const int* send, int* recv, int n) const {
  HPCT_CHECK_MPI(MPI_Alltoall(send, n, MPI_INT, recv, n, MPI_INT, comm_));
}

void Communicator::alltoallv_rows(const float* send, const std::vector<int>& send_rows, float* recv,
                                  const std::vector<int>& recv_rows, int width) const {
  std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
  long long so = 0, ro = 0;
  for (int i = 0; i < size_; ++i) {
    const long long s = (long long)send_rows[i] * width, r = (long long)recv_rows[i] * width;
    if (so + s > INT_MAX || ro + r > INT_MAX)
      throw Error("alltoallv_rows: more than 2^31 elements in one exchange; use smaller micro-batches");
    sc[i] = (int)s, sd[i] = (int)so, rc[i] = (int)r, rd[i] = (int)ro;
    so += s, ro += r;
  }
  HPCT_CHECK_MPI(MPI_Alltoallv(send, sc.data(), sd.data(), MPI_FLOAT, recv, rc.data(), rd.data(), MPI_FLOAT, comm_));
}

void Communicator::allgather_blocks(float* data, size_t n) const {
  if (size_ == 1) return;
  if ((unsigned long long)n * size_ > INT_MAX) throw Error("allgather_blocks: more than 2^31 elements; use smaller micro-batches");
  HPCT_CHECK_MPI(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, static_cast<int>(n), MPI_FLOAT, comm_));
}

void Communicator::allgatherv_rows(float* data, const std::vector<int>& rows, int width) const {
  if (size_ == 1) return;
  std::vector<int> counts(size_), displs(size_);
  long long at = 0;
  for (int i = 0; i < size_; ++i) {
    const long long n = (long long)rows[i] * width;
    if (at + n > INT_MAX) throw Error("allgatherv_rows: more than 2^31 elements; use smaller micro-batches");
    counts[i] = (int)n, displs[i] = (int)at;
    at += n;
  }
  HPCT_CHECK_MPI(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, counts.data(), displs.data(), MPI_FLOAT, comm_));
}

void Communicator::reduce_scatterv_rows(const float* send, float* recv, const std::vector<int>& rows, int width) const {
  std::vector<int> counts(size_);
  long long at = 0;
  for (int i = 0; i < size_; ++i) {
    const long long n = (long long)rows[i] * width;
    if (at + n > INT_MAX) throw Error("reduce_scatterv_rows: more than 2^31 elements; use smaller micro-batches");
    counts[i] = (int)n;
    at += n;
  }
  if (size_ == 1) {
    if (recv != send) std::memmove(recv, send, (size_t)counts[0] * sizeof(float));
    return;
  }
  HPCT_CHECK_MPI(MPI_Reduce_scatter(send, recv, counts.data(), MPI_FLOAT, MPI_SUM, comm_));
}

void Communicator::reduce_scatter_blocks(const float* send, float* recv, size_t n) const {
  if (size_ == 1) {
    if (recv != send) std::memmove(recv, send, n * sizeof(float));
    return;
  }
  if ((unsigned long long)n * size_ > INT_MAX) throw Error("reduce_scatter_blocks: more than 2^31 elements; use smaller micro-batches");
  HPCT_CHECK_MPI(MPI_Reduce_scatter_block(send, recv, static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm_));
}

double Communicator::allreduce_max(double v) const {
  HPCT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, comm_));
  return v;
}
double Communicator::allreduce_min(double v) const {
  HPCT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MIN, comm_));
  return v;
}

void Communicator::reduce_sum(double* data, size_t n, int root) const {
  if (rank_ == root)
    HPCT_CHECK_MPI(MPI_Reduce(MPI_IN_PLACE, data, static_cast<int>(n), MPI_DOUBLE, MPI_SUM, root, comm_));
  else
    HPCT_CHECK_MPI(MPI_Reduce(data, nullptr, static_cast<int>(n), MPI_DOUBLE, MPI_SUM, root, comm_));
}

void Communicator::bcast_bytes(void* data, size_t n, int root) const {
  HPCT_CHECK_MPI(MPI_Bcast(data, static_cast<int>(n), MPI_BYTE, root, comm_));
}

void Communicator::bcast_string(std::string& s, int root) const {
  unsigned long long n = s.size();
  HPCT_CHECK_MPI(MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, root, comm_));
  s.resize(n);
  if (n) bcast_bytes(s.data(), n, root);
}

std::vector<double> Communicator::allgather(double v) const {
  std::vector<double> out(size_);
  HPCT_CHECK_MPI(MPI_Allgather(&v, 1, MPI_DOUBLE, out.data(), 1, MPI_DOUBLE, comm_));
  return out;
}

std::vector<double> Communicator::allgather(const std::vector<double>& v) const {
  HPCT_REQUIRE(v.size() < (1u << 30), "allgather: too many values");
  std::vector<double> out(v.size() * static_cast<size_t>(size_));
  HPCT_CHECK_MPI(MPI_Allgather(v.data(), static_cast<int>(v.size()), MPI_DOUBLE, out.data(), static_cast<int>(v.size()),
                               MPI_DOUBLE, comm_));
  return out;
}

std::vector<std::string> Communicator::allgather_string(const std::string& s) const {
  HPCT_REQUIRE(s.size() < (1u << 30), "allgather_string: string too long");
  int n = static_cast<int>(s.size());
  std::vector<int> counts(size_), displs(size_);
  HPCT_CHECK_MPI(MPI_Allgather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, comm_));
  long total = 0;
  for (int r = 0; r < size_; ++r) {
    displs[r] = static_cast<int>(total);
    total += counts[r];
  }
  HPCT_REQUIRE(total < (1L << 31), "allgather_string: strings too long in total");
  std::string all(static_cast<size_t>(total), '\0');
  HPCT_CHECK_MPI(MPI_Allgatherv(s.data(), n, MPI_CHAR, all.data(), counts.data(), displs.data(), MPI_CHAR, comm_));
  std::vector<std::string> out(size_);
  for (int r = 0; r < size_; ++r) out[r] = all.substr(static_cast<size_t>(displs[r]), static_cast<size_t>(counts[r]));
  return out;
}

Request& Request::operator=(Request&& o) noexcept {
  if (this != &o) {
    if (r_ != MPI_REQUEST_NULL) MPI_Wait(&r_, MPI_STATUS_IGNORE);
    r_ = o.r_;
    o.r_ = MPI_REQUEST_NULL;
  }
  return *this;
}

Request::~Request() {
  if (r_ != MPI_REQUEST_NULL) MPI_Wait(&r_, MPI_STATUS_IGNORE);
}

void Request::wait() {
  if (r_ != MPI_REQUEST_NULL) HPCT_CHECK_MPI(MPI_Wait(&r_, MPI_STATUS_IGNORE));
}

bool Request::test() {
  if (r_ == MPI_REQUEST_NULL) return true;
  int flag = 0;
  HPCT_CHECK_MPI(MPI_Test(&r_, &flag, MPI_STATUS_IGNORE));
  return flag != 0;
}

Request Communicator::iallreduce_sum(float* data, size_t n) const {
  if (size_ == 1) return Request();
  if (n >= (size_t(1) << 31)) throw Error("iallreduce_sum: " + std::to_string(n) + " elements exceed one MPI call");
  MPI_Request r;
  HPCT_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm_, &r));
  return Request(r);
}

bool all_ok(const Communicator& comm, bool ok) { return comm.allreduce_min(ok ? 1.0 : 0.0) > 0.5; }

void throw_if_any(const Communicator& comm, const std::string& error) {
  auto errs = comm.allgather_string(error);
  const bool whole_world = comm.size() == Communicator::world().size();
  for (int r = 0; r < comm.size(); ++r)
    if (!errs[r].empty()) {
      std::string line = errs[r].rfind("[rank", 0) == 0 ? errs[r] : "[rank " + std::to_string(r) + "] " + errs[r];
      throw whole_world ? Error::agreed(line) : Error::relayed(line);
    }
}

}  // namespace hpct::comm
