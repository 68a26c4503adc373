#include "client/python/proto_dict.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/util/json_util.h>

#include "absl/strings/str_cat.h"

namespace tutti::python {
namespace py = pybind11;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

namespace {

py::object Value(const Message& m, const Reflection* r, const FieldDescriptor* f, int i) {
  const bool rep = f->is_repeated();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return py::int_(rep ? r->GetRepeatedInt32(m, f, i) : r->GetInt32(m, f));
    case FieldDescriptor::CPPTYPE_INT64:
      return py::int_(rep ? r->GetRepeatedInt64(m, f, i) : r->GetInt64(m, f));
    case FieldDescriptor::CPPTYPE_UINT32:
      return py::int_(rep ? r->GetRepeatedUInt32(m, f, i) : r->GetUInt32(m, f));
    case FieldDescriptor::CPPTYPE_UINT64:
      return py::int_(rep ? r->GetRepeatedUInt64(m, f, i) : r->GetUInt64(m, f));
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return py::float_(rep ? r->GetRepeatedDouble(m, f, i) : r->GetDouble(m, f));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return py::float_(rep ? r->GetRepeatedFloat(m, f, i) : r->GetFloat(m, f));
    case FieldDescriptor::CPPTYPE_BOOL:
      return py::bool_(rep ? r->GetRepeatedBool(m, f, i) : r->GetBool(m, f));
    case FieldDescriptor::CPPTYPE_ENUM:
      return py::str((rep ? r->GetRepeatedEnum(m, f, i) : r->GetEnum(m, f))->name());
    case FieldDescriptor::CPPTYPE_STRING: {
      const std::string s = rep ? r->GetRepeatedString(m, f, i) : r->GetString(m, f);
      if (f->type() == FieldDescriptor::TYPE_BYTES) return py::bytes(s);
      return py::str(s);
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return ProtoToDict(rep ? r->GetRepeatedMessage(m, f, i) : r->GetMessage(m, f));
  }
  return py::none();
}

}  // namespace

py::dict ProtoToDict(const Message& m) {
  py::dict out;
  const auto* d = m.GetDescriptor();
  const Reflection* r = m.GetReflection();
  for (int k = 0; k < d->field_count(); ++k) {
    const FieldDescriptor* f = d->field(k);
    if (f->is_repeated()) {
      py::list items;
      for (int i = 0; i < r->FieldSize(m, f); ++i) items.append(Value(m, r, f, i));
      out[py::str(f->name())] = items;
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !r->HasField(m, f)) {
      out[py::str(f->name())] = py::none();
    } else {
      out[py::str(f->name())] = Value(m, r, f, -1);
    }
  }
  return out;
}

absl::Status ProtoFromPython(const py::handle& value, Message* out) {
  const std::string type = out->GetDescriptor()->full_name();
  if (py::isinstance<py::bytes>(value)) {
    if (!out->ParseFromString(value.cast<std::string>())) {
      return absl::InvalidArgumentError(absl::StrCat("the bytes are not a serialized ", type));
    }
    return absl::OkStatus();
  }
  if (!py::isinstance<py::dict>(value)) {
    return absl::InvalidArgumentError(absl::StrCat("expected a ", type,
                                                   " as a dict or serialized bytes, got ",
                                                   py::str(value.get_type()).cast<std::string>()));
  }
  // Drop None values (unset messages) so a dict from ProtoToDict round-trips.
  std::function<py::object(py::handle)> clean = [&](py::handle v) -> py::object {
    if (py::isinstance<py::dict>(v)) {
      py::dict d;
      for (auto kv : v.cast<py::dict>()) {
        if (!kv.second.is_none()) d[kv.first] = clean(kv.second);
      }
      return d;
    }
    if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) {
      py::list l;
      for (auto item : v) l.append(clean(item));
      return l;
    }
    return py::reinterpret_borrow<py::object>(v);
  };
  std::string json;
  try {
    json = py::module_::import("json").attr("dumps")(clean(value)).cast<std::string>();
  } catch (const py::error_already_set& e) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read the ", type, " dict: ", e.what()));
  }
  google::protobuf::util::JsonParseOptions opts;
  auto s = google::protobuf::util::JsonStringToMessage(json, out, opts);
  if (!s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("not a valid ", type, ": ", s.ToString()));
  }
  return absl::OkStatus();
}

}  // namespace tutti::python
