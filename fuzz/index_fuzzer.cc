// The index loader over arbitrary bytes (checksums included: the seeds are
// real indexes, so mutations that keep the checksums reach the parser
// behind them). Whatever it accepts must be consistent enough to walk:
// samples, streams, skip records, bad shards.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "services/packer/index/index.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto index = tutti::packer::Index::FromString(
      std::string(reinterpret_cast<const char*>(data), size), "fuzz.idx");
  if (!index.ok()) return 0;
  const tutti::packer::Index& ix = **index;
  // The streams hold every sample once, each in the one its members say.
  if (ix.text_samples().size() + ix.vl_samples().size() != ix.num_samples()) std::abort();
  for (uint32_t s : ix.text_samples()) {
    if (s >= ix.num_samples() || ix.is_vl(s)) std::abort();
  }
  for (uint32_t s : ix.vl_samples()) {
    if (s >= ix.num_samples() || !ix.is_vl(s)) std::abort();
  }
  for (const auto& k : ix.skips()) {
    if (k.shard >= ix.num_shards() || k.count == 0) std::abort();
  }
  for (const auto& b : ix.bad_shards()) (void)b.name.size();
  (void)ix.memory_bytes();
  for (uint32_t s = 0; s < ix.num_samples(); ++s) {
    if (ix.ShardOf(s) >= ix.num_shards()) std::abort();
    (void)ix.key(s);
    (void)ix.MemberName(s, ix.text_ext(s));
    for (uint32_t j = ix.media_begin(s); j < ix.media_end(s); ++j) {
      if (j >= ix.num_media()) std::abort();
      tutti::packer::MediaView m = ix.media(j);
      if (m.ext >= ix.num_exts()) std::abort();
      (void)ix.MemberName(s, m.ext);
    }
  }
  return 0;
}
