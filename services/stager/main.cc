// tutti-stagerd: one per node. Stages the job's shards into a node-local
// cache, decodes what this node's ranks' plans name and hands ready batches
// to local clients through shared memory (services/stager/README.md).
#include "common/daemon.h"
#include "services/stager/stagerd_flags.h"

int main(int argc, char** argv) {
  return tutti::RunDaemon(argc, argv, tutti::stager::StagerdMain());
}
