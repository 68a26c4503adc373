// tutti-packerd: one per job; serves step plans over gRPC (tutti.v1.Packer).
#include "common/daemon.h"
#include "services/packer/packerd_flags.h"

int main(int argc, char** argv) {
  return tutti::RunDaemon(argc, argv, tutti::packer::PackerdMain());
}
