// Element sizes and names of tutti.v1.DType, for everyone who lays out or
// reads arrays (packer byte counts, stager batches, client views).
#ifndef TUTTI_COMMON_DTYPE_H_
#define TUTTI_COMMON_DTYPE_H_

#include <cstddef>

#include "absl/strings/string_view.h"
#include "tutti/v1/common.pb.h"

namespace tutti {

// Bytes per element; 0 for an unknown dtype.
size_t DTypeSize(v1::DType dtype);
// "float32", "bfloat16", "int32", "int64", "uint8", "float16"; "unknown".
absl::string_view DTypeName(v1::DType dtype);

}  // namespace tutti

#endif  // TUTTI_COMMON_DTYPE_H_
