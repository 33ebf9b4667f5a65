// main() of an engine test run under mpirun: MPI and the compute backend up, gtest's printer on
// rank 0 only, and a failure on any rank failing the binary on every rank.
#pragma once
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "hpct/comm/mpi.hpp"
#include "hpct/kernels/backend.hpp"

namespace hpct::test {

/// MPI_COMM_WORLD as a Communicator (after mpi_gtest_main has started MPI).
inline const comm::Communicator& world() {
  static comm::Communicator w = comm::Communicator::world();
  return w;
}

/// A scratch directory shared by all ranks of `comm` (named by rank 0's pid and `tag`), created empty.
inline std::string shared_dir(const comm::Communicator& comm, const std::string& tag) {
  std::string d;
  if (comm.rank() == 0) {
    d = (std::filesystem::temp_directory_path() / ("hpct_test_" + std::to_string(::getpid()) + "_" + tag)).string();
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
  }
  comm.bcast_string(d, 0);
  return d;
}

inline int mpi_gtest_main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  comm::Environment env(&argc, &argv);
  kernels::BackendScope backend;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& l = ::testing::UnitTest::GetInstance()->listeners();
    delete l.Release(l.default_result_printer());
  }
  int rc = RUN_ALL_TESTS();
  int any = rc;
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any;
}

}  // namespace hpct::test
