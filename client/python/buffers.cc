#include "client/python/buffers.h"

#include <cctype>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/python/py_status.h"

namespace tutti::python {

namespace py = pybind11;

// Bytes per element of an array-interface typestr ("<f4", "|u1", "<V2"...).
namespace {

size_t TypestrBytes(const std::string& typestr, const char* what) {
  size_t n = 0;
  if (typestr.size() >= 3) {
    for (size_t i = 2; i < typestr.size() && std::isdigit(static_cast<unsigned char>(typestr[i]));
         ++i) {
      n = n * 10 + (typestr[i] - '0');
    }
  }
  if (n == 0) {
    Throw(absl::InvalidArgumentError(
        absl::StrCat("the ", what, " buffer's typestr '", typestr, "' is not understood")));
  }
  return n;
}

// From an __array_interface__ / __cuda_array_interface__ dict: the data
// pointer (checked contiguous and, for receiving, writable) and its size.
Buffer FromInterface(const py::dict& iface, bool writable, bool device, const char* what) {
  Buffer b;
  b.device = device;
  const char* name = device ? "__cuda_array_interface__" : "__array_interface__";
  if (!iface.contains("data") || !iface.contains("shape") || !iface.contains("typestr")) {
    Throw(absl::InvalidArgumentError(
        absl::StrCat("the ", what, " buffer's ", name, " lacks data, shape or typestr")));
  }
  py::object data = iface["data"];
  if (!py::isinstance<py::tuple>(data) || py::len(data) != 2) {
    Throw(absl::InvalidArgumentError(absl::StrCat(
        "the ", what, " buffer's ", name,
        " data is not a (pointer, read_only) pair; pass numpy.ascontiguousarray(...)")));
  }
  py::tuple pair = data;
  b.ptr = reinterpret_cast<void*>(pair[0].cast<uintptr_t>());
  if (writable && pair[1].cast<bool>()) {
    Throw(absl::InvalidArgumentError(
        absl::StrCat("the ", what, " buffer must be writable (its ", name, " says read-only)")));
  }
  const size_t item = TypestrBytes(iface["typestr"].cast<std::string>(), what);
  py::tuple shape = iface["shape"];
  size_t count = 1;
  for (auto d : shape) count *= d.cast<size_t>();
  if (iface.contains("strides") && !iface["strides"].is_none()) {
    py::tuple strides = iface["strides"];
    size_t expect = item;
    for (int d = static_cast<int>(py::len(shape)) - 1; d >= 0; --d) {
      const size_t extent = shape[d].cast<size_t>();
      if (extent > 1 && strides[d].cast<int64_t>() != static_cast<int64_t>(expect)) {
        Throw(absl::InvalidArgumentError(absl::StrCat(
            "the ", what, " buffer is not C-contiguous; pass a contiguous copy (.contiguous())")));
      }
      expect *= extent;
    }
  }
  b.bytes = count * item;
  if (b.ptr == nullptr && b.bytes > 0) {
    Throw(absl::InvalidArgumentError(absl::StrCat("the ", what, " buffer has a null pointer")));
  }
  return b;
}

}  // namespace

// Any Python object holding `what` bytes: the buffer protocol (numpy
// arrays, bytes, bytearray, memoryview), or __array_interface__, or
// __cuda_array_interface__ (CUDA tensors: device memory).
Buffer GetBuffer(const py::object& obj, bool writable, const char* what) {
  if (py::hasattr(obj, "__cuda_array_interface__")) {
    return FromInterface(obj.attr("__cuda_array_interface__"), writable, true, what);
  }
  if (PyObject_CheckBuffer(obj.ptr())) {
    Buffer b;
    try {
      b.info = py::reinterpret_borrow<py::buffer>(obj).request(writable);
    } catch (const py::error_already_set& e) {
      Throw(absl::InvalidArgumentError(absl::StrCat(
          "the ", what, " buffer must be ", writable ? "writable" : "readable", ": ", e.what())));
    }
    const py::buffer_info& info = *b.info;
    py::ssize_t expect = info.itemsize;
    for (int d = info.ndim - 1; d >= 0; --d) {
      if (info.shape[d] > 1 && info.strides[d] != expect) {
        Throw(absl::InvalidArgumentError(absl::StrCat(
            "the ", what, " buffer is not C-contiguous; pass numpy.ascontiguousarray(...)")));
      }
      expect *= info.shape[d];
    }
    b.ptr = info.ptr;
    b.bytes = static_cast<size_t>(info.size * info.itemsize);
    return b;
  }
  if (py::hasattr(obj, "__array_interface__")) {
    Buffer b = FromInterface(obj.attr("__array_interface__"), writable, false, what);
    b.owner = obj;
    return b;
  }
  Throw(absl::InvalidArgumentError(absl::StrCat(
      "the ", what, " buffer (", std::string(py::str(py::type::of(obj).attr("__name__"))),
      ") is not a buffer: pass a numpy array or any object with the buffer protocol or "
      "__array_interface__ (a torch CPU tensor: t.numpy()); CUDA tensors "
      "(__cuda_array_interface__) go through tutti.NcclTransport")));
}

namespace {

// The MPI transport moves host memory only.
void RequireHost(const Buffer& b, const char* what) {
  if (!b.device) return;
#if TUTTI_HAVE_NCCL
  Throw(absl::InvalidArgumentError(absl::StrCat(
      "the ", what,
      " buffer is CUDA device memory (__cuda_array_interface__) but the MPI "
      "transport exchanges host memory: use tutti.NcclTransport for device buffers, or pass "
      ".cpu().numpy()")));
#else
  Throw(absl::InvalidArgumentError(
      absl::StrCat("the ", what,
                   " buffer is CUDA device memory (__cuda_array_interface__), but this build of "
                   "tutti has no NCCL transport (rebuild where CUDA and NCCL are found, cmake "
                   "-DTUTTI_WITH_CUDA=ON); or copy to the host with .cpu().numpy()")));
#endif
}

}  // namespace

void CheckBuffers(const py::object& send, const py::object& recv, bool device, Buffer* send_buf,
                  Buffer* recv_buf) {
  Buffer& s = *send_buf;
  Buffer& r = *recv_buf;
  s = GetBuffer(send, false, "send");
  r = GetBuffer(recv, true, "receive");
  if (!device) {
    RequireHost(s, "send");
    RequireHost(r, "receive");
  } else {
    for (const auto& [b, what] :
         {std::pair<const Buffer*, const char*>{&s, "send"}, {&r, "receive"}}) {
      if (!b->device && b->bytes > 0) {
        Throw(absl::InvalidArgumentError(
            absl::StrCat("the ", what,
                         " buffer is host memory but the NCCL transport exchanges CUDA device "
                         "memory: pass CUDA tensors (objects with __cuda_array_interface__)")));
      }
    }
  }
}

}  // namespace tutti::python
