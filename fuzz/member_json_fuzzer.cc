// The parsers of a sample's k.json: the index builder's token count and the
// stager's input_ids reader, over arbitrary bytes.
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "services/packer/index/text_tokens.h"
#include "services/stager/decode/batch_layout.h"
#include "services/stager/decode/members.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view json(reinterpret_cast<const char*>(data), size);
  (void)tutti::packer::JsonTokenCount(json, tutti::packer::kDefaultBytesPerToken);
  auto ids = tutti::stager::ParseInputIds(json);
  if (ids.ok()) (void)tutti::stager::FitTokens(*ids, ids->size() % 97);
  return 0;
}
