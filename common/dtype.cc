#include "common/dtype.h"

namespace tutti {

size_t DTypeSize(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return 4;
    case v1::DTYPE_BFLOAT16:
      return 2;
    case v1::DTYPE_INT32:
      return 4;
    case v1::DTYPE_INT64:
      return 8;
    case v1::DTYPE_UINT8:
      return 1;
    case v1::DTYPE_FLOAT16:
      return 2;
    default:
      return 0;
  }
}

absl::string_view DTypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return "float32";
    case v1::DTYPE_BFLOAT16:
      return "bfloat16";
    case v1::DTYPE_INT32:
      return "int32";
    case v1::DTYPE_INT64:
      return "int64";
    case v1::DTYPE_UINT8:
      return "uint8";
    case v1::DTYPE_FLOAT16:
      return "float16";
    default:
      return "unknown";
  }
}

}  // namespace tutti
