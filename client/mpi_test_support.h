// For GoogleTest programs run under mpirun (one process per rank): the
// world's rank and size, and running the tests with only rank 0 printing
// the normal output (the others print their failures, prefixed by rank).
// Test-only, header-only.
#ifndef TUTTI_CLIENT_MPI_TEST_SUPPORT_H_
#define TUTTI_CLIENT_MPI_TEST_SUPPORT_H_

#include <mpi.h>

#include <cstdint>
#include <cstdio>

#include "gtest/gtest.h"

namespace tutti::testing {

inline uint32_t WorldRank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return static_cast<uint32_t>(r);
}

inline uint32_t WorldSize() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return static_cast<uint32_t>(n);
}

// Prints failures of ranks other than 0 (rank 0 keeps the normal output).
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(uint32_t rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %u] %s:%d: %s\n", rank_, r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.summary());
  }

 private:
  uint32_t rank_;
};

// RUN_ALL_TESTS on every rank (after InitGoogleTest and MPI_Init), then
// MPI_Finalize; the worst result of any rank, as the exit status.
inline int RunAllTestsOnEveryRank() {
  const uint32_t rank = WorldRank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  int rc = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}

}  // namespace tutti::testing

#endif  // TUTTI_CLIENT_MPI_TEST_SUPPORT_H_
