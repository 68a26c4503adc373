// Python objects as the raw buffers an exchange moves: the buffer protocol
// (numpy arrays, bytes, bytearray, memoryview), __array_interface__, or
// __cuda_array_interface__ (device memory), checked C-contiguous and, to
// receive, writable.
#ifndef TUTTI_CLIENT_PYTHON_BUFFERS_H_
#define TUTTI_CLIENT_PYTHON_BUFFERS_H_

#include <pybind11/pybind11.h>

#include <cstddef>
#include <optional>

namespace tutti::python {

// A contiguous buffer handed in from Python, host or device memory.
struct Buffer {
  std::optional<pybind11::buffer_info> info;  // holds a buffer-protocol export
  pybind11::object owner;                     // keeps an __array_interface__ exporter alive
  void* ptr = nullptr;
  size_t bytes = 0;
  bool device = false;  // from __cuda_array_interface__
};

// Any Python object holding `what` bytes (see above); throws StatusError
// (INVALID_ARGUMENT) naming the problem and the fix.
Buffer GetBuffer(const pybind11::object& obj, bool writable, const char* what);

// The send and receive buffers of one exchange: host memory for the MPI
// transport, device memory when `device` (NCCL). Throws StatusError.
void CheckBuffers(const pybind11::object& send, const pybind11::object& recv, bool device,
                  Buffer* send_buf, Buffer* recv_buf);

}  // namespace tutti::python

#endif  // TUTTI_CLIENT_PYTHON_BUFFERS_H_
