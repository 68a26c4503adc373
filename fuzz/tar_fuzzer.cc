// The tar reader over arbitrary bytes: every member it reports lies inside
// the archive, and it ends (no member list longer than the archive allows).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/file_io.h"
#include "common/tar.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  auto file = tutti::MakeMemoryFile("fuzz.tar", bytes);
  uint64_t members = 0;
  const absl::Status s = tutti::ForEachTarMember(*file, [&](const tutti::TarMember& m) {
    // Each member takes at least one 512-byte header block.
    if (++members > size / 512) std::abort();
    if (m.data_offset > size || m.size > size - m.data_offset) std::abort();
    auto [key, ext] = tutti::SplitWebDatasetName(m.name);
    if (key.size() + ext.size() > m.name.size()) std::abort();
    return absl::OkStatus();
  });
  (void)s;
  return 0;
}
