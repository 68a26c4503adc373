// A non-OK absl::Status crossing into Python: thrown as StatusError, turned
// into a tutti.Error subclass by the module's exception translator.
#ifndef TUTTI_CLIENT_PYTHON_PY_STATUS_H_
#define TUTTI_CLIENT_PYTHON_PY_STATUS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tutti::python {

struct StatusError {
  absl::Status status;
};

[[noreturn]] inline void Throw(const absl::Status& s) { throw StatusError{s}; }
inline void Check(const absl::Status& s) {
  if (!s.ok()) Throw(s);
}
template <typename T>
T Value(absl::StatusOr<T> v) {
  if (!v.ok()) Throw(v.status());
  return std::move(*v);
}

}  // namespace tutti::python

#endif  // TUTTI_CLIENT_PYTHON_PY_STATUS_H_
