// Protobuf messages as plain Python values for the `tutti` module: messages
// become dicts keyed by field name (every field present, unset messages as
// None), repeated fields lists, enums their value names, 64-bit integers
// Python ints. The reverse goes through JSON, which accepts the same names.
#ifndef TUTTI_CLIENT_PYTHON_PROTO_DICT_H_
#define TUTTI_CLIENT_PYTHON_PROTO_DICT_H_

#include <google/protobuf/message.h>
#include <pybind11/pybind11.h>

#include "absl/status/status.h"

namespace tutti::python {

pybind11::dict ProtoToDict(const google::protobuf::Message& message);

// Fills `out` from bytes (serialized) or a dict (field names as in the
// .proto). INVALID_ARGUMENT naming the message type and the problem.
absl::Status ProtoFromPython(const pybind11::handle& value, google::protobuf::Message* out);

}  // namespace tutti::python

#endif  // TUTTI_CLIENT_PYTHON_PROTO_DICT_H_
