// The Python binding: `import tutti` (built into <build>/python).
//
//   client = tutti.Client(stager="127.0.0.1:7071", packer="127.0.0.1:7070",
//                         rank=0, world_size=4, start_step=0)
//   for batch in client:                    # or client.next()
//       px = batch.pixel_values             # numpy view of shared memory (no copy)
//       ...
//       client.exchange(send, recv)         # the step's all-to-all (MPI)
//       batch.release()                     # or `with client.next() as batch:`
//
// Arrays are read-only numpy views of the stager's shared memory; each keeps
// the mapping alive, so a view never dangles, but after release() the stager
// may overwrite it: copy what must outlive the batch. bfloat16 has no numpy
// dtype: such arrays are uint16 with batch.dtypes[name] == "bfloat16"
// (torch.from_numpy(a).view(torch.bfloat16) reinterprets without copying).
//
// Exchanges use MPI: the module initialises MPI on first use if nothing else
// has (MPI_THREAD_SERIALIZED) and finalises it at exit. Run ranks under
// mpirun; a lone process is a world of one. Host buffers are numpy arrays or
// any object with the buffer protocol or __array_interface__ (a torch CPU
// tensor through .numpy()); CUDA tensors (__cuda_array_interface__) go
// through tutti.NcclTransport, present when built with CUDA and NCCL
// (tutti.HAVE_NCCL).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cctype>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/mpi_transport.h"
#include "client/python/proto_dict.h"
#include "common/dtype.h"
#include "tutti/v1/packer.pb.h"
#include "tutti/v1/stager.pb.h"
#if TUTTI_HAVE_NCCL
#include "client/nccl_transport.h"
#endif

namespace tutti::python {
namespace {

namespace py = pybind11;

// A non-OK Status crossing into Python.
struct StatusError {
  absl::Status status;
};

[[noreturn]] void Throw(const absl::Status& s) { throw StatusError{s}; }
void Check(const absl::Status& s) {
  if (!s.ok()) Throw(s);
}
template <typename T>
T Value(absl::StatusOr<T> v) {
  if (!v.ok()) Throw(v.status());
  return std::move(*v);
}

struct Exceptions {
  py::object error, invalid_argument, deadline, unavailable, not_found, out_of_range,
      failed_precondition, data_loss;
};
Exceptions& Exc() {
  static Exceptions* e = new Exceptions();
  return *e;
}

py::object NewException(py::module_& m, const char* name, py::tuple bases, const char* doc) {
  const std::string full = absl::StrCat("tutti.", name);
  py::object cls = py::reinterpret_steal<py::object>(
      PyErr_NewExceptionWithDoc(full.c_str(), doc, bases.ptr(), nullptr));
  m.attr(name) = cls;
  return cls;
}

void RegisterExceptions(py::module_& m) {
  Exceptions& e = Exc();
  e.error = NewException(m, "Error", py::make_tuple(py::handle(PyExc_RuntimeError)),
                         "A tutti error; `code` holds the status code name.");
  auto sub = [&](const char* name, PyObject* also, const char* doc) {
    return NewException(m, name, py::make_tuple(e.error, py::handle(also)), doc);
  };
  e.invalid_argument =
      sub("InvalidArgumentError", PyExc_ValueError, "Bad input (INVALID_ARGUMENT).");
  e.deadline = sub("DeadlineExceededError", PyExc_TimeoutError, "Timed out (DEADLINE_EXCEEDED).");
  e.unavailable =
      sub("UnavailableError", PyExc_ConnectionError, "A daemon is unreachable (UNAVAILABLE).");
  e.not_found =
      sub("NotFoundError", PyExc_LookupError, "Missing file, segment or job (NOT_FOUND).");
  e.out_of_range =
      sub("OutOfRangeError", PyExc_IndexError, "Past the dataset's end (OUT_OF_RANGE).");
  e.failed_precondition = NewException(m, "FailedPreconditionError", py::make_tuple(e.error),
                                       "Valid request, wrong state (FAILED_PRECONDITION).");
  e.data_loss =
      NewException(m, "DataLossError", py::make_tuple(e.error), "Corrupt data (DATA_LOSS).");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& err) {
      Exceptions& x = Exc();
      py::object type = x.error;
      switch (err.status.code()) {
        case absl::StatusCode::kInvalidArgument:
          type = x.invalid_argument;
          break;
        case absl::StatusCode::kDeadlineExceeded:
          type = x.deadline;
          break;
        case absl::StatusCode::kUnavailable:
          type = x.unavailable;
          break;
        case absl::StatusCode::kNotFound:
          type = x.not_found;
          break;
        case absl::StatusCode::kOutOfRange:
          type = x.out_of_range;
          break;
        case absl::StatusCode::kFailedPrecondition:
          type = x.failed_precondition;
          break;
        case absl::StatusCode::kDataLoss:
          type = x.data_loss;
          break;
        default:
          break;
      }
      py::object inst = type(std::string(err.status.message()));
      inst.attr("code") = py::str(absl::StatusCodeToString(err.status.code()));
      PyErr_SetObject(type.ptr(), inst.ptr());
    }
  });
}

py::dtype NumpyDType(v1::DType d) {
  switch (d) {
    case v1::DTYPE_FLOAT32:
      return py::dtype::of<float>();
    case v1::DTYPE_BFLOAT16:
      return py::dtype::of<uint16_t>();  // see the module comment
    case v1::DTYPE_FLOAT16:
      return py::dtype("float16");
    case v1::DTYPE_INT32:
      return py::dtype::of<int32_t>();
    case v1::DTYPE_INT64:
      return py::dtype::of<int64_t>();
    case v1::DTYPE_UINT8:
      return py::dtype::of<uint8_t>();
    default:
      Throw(absl::DataLossError(
          absl::StrCat("no numpy dtype for tutti dtype ", static_cast<int>(d))));
  }
}

// A read-only numpy array over `v`, whose base keeps the mapping alive.
py::array View(const ArrayView& v, std::shared_ptr<const ShmSegment> segment) {
  auto* held = new std::shared_ptr<const ShmSegment>(std::move(segment));
  py::capsule base(held,
                   [](void* p) { delete static_cast<std::shared_ptr<const ShmSegment>*>(p); });
  std::vector<py::ssize_t> shape(v.shape.begin(), v.shape.end());
  py::array a(NumpyDType(v.dtype), shape, v.data, base);
  py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return a;
}

// A contiguous buffer handed in from Python, host or device memory.
struct Buffer {
  std::optional<py::buffer_info> info;  // holds a buffer-protocol export
  py::object owner;                     // keeps an __array_interface__ exporter alive
  void* ptr = nullptr;
  size_t bytes = 0;
  bool device = false;  // from __cuda_array_interface__
};

// Bytes per element of an array-interface typestr ("<f4", "|u1", "<V2"...).
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

// ---- Batch ----------------------------------------------------------------

class PyBatch {
 public:
  explicit PyBatch(Batch batch) : batch_(std::make_unique<Batch>(std::move(batch))) {}
  PyBatch(PyBatch&&) = default;
  // Releasing may wait on the stager (retries): not while holding the GIL.
  ~PyBatch() {
    if (batch_ != nullptr && !batch_->released() && Py_IsInitialized()) {
      py::gil_scoped_release nogil;
      batch_.reset();
    }
  }

  const Batch& batch() const {
    if (batch_->released()) {
      Throw(absl::FailedPreconditionError(
          absl::StrCat(ExchangeWhere(step_(), rank_()), ": the batch was released")));
    }
    return *batch_;
  }
  uint64_t step_() const { return batch_->step(); }
  uint32_t rank_() const { return batch_->rank(); }

  py::dict arrays() {
    if (!arrays_) {
      const Batch& b = batch();
      py::dict d;
      for (const ArrayView& v : b.arrays()) d[py::str(v.name)] = View(v, b.segment());
      arrays_ = d;
    }
    return *arrays_;
  }
  py::object array(const std::string& name) {
    py::dict d = arrays();
    return d.contains(name) ? py::object(d[py::str(name)]) : py::none();
  }
  py::dict dtypes() const {
    py::dict d;
    for (const ArrayView& v : batch().arrays())
      d[py::str(v.name)] = py::str(std::string(DTypeName(v.dtype)));
    return d;
  }
  void release() {
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      s = batch_->Release();
    }
    Check(s);
  }
  Batch& raw() { return *batch_; }

 private:
  std::unique_ptr<Batch> batch_;
  std::optional<py::dict> arrays_;
};

// ---- transports and exchanges ----------------------------------------------

v1::RankPlan PlanFrom(const py::handle& plan) {
  v1::RankPlan p;
  Check(ProtoFromPython(plan, &p));
  return p;
}

// Runs one exchange of `plan` in direction `dir` between Python buffers;
// `device`: the transport moves device memory (NCCL), else host memory.
void RunExchange(Transport& t, ExchangeDirection dir, const v1::RankPlan& plan,
                 const py::object& send, const py::object& recv, const ExchangeContext& ctx,
                 bool device = false) {
  Buffer s = GetBuffer(send, false, "send");
  Buffer r = GetBuffer(recv, true, "receive");
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
  absl::Status status;
  {
    py::gil_scoped_release nogil;
    switch (dir) {
      case ExchangeDirection::kForward:
        status = t.Exchange(plan, s.ptr, s.bytes, r.ptr, r.bytes, ctx);
        break;
      case ExchangeDirection::kBackward:
        status = t.ExchangeBackward(plan, s.ptr, s.bytes, r.ptr, r.bytes, ctx);
        break;
      case ExchangeDirection::kLoad:
        status = t.ExchangeLoad(plan, s.ptr, s.bytes, r.ptr, r.bytes, ctx);
        break;
    }
  }
  Check(status);
}

MpiTransportOptions TransportOptions(bool verify, double join_timeout,
                                     std::optional<uint64_t> max_count) {
  MpiTransportOptions o;
  o.verify = verify;
  o.join_timeout = absl::Seconds(join_timeout);
  if (max_count) o.max_count = *max_count;
  return o;
}

struct PyMpiTransport {
  std::unique_ptr<MpiTransport> mpi;
  Transport& transport() { return *mpi; }
};

#if TUTTI_HAVE_NCCL
#define TUTTI_HAVE_NCCL_PY true
// NCCL on device `device` for every rank of MPI_COMM_WORLD, the agreement
// over an MpiTransport of the same ranks, a stream of its own.
struct PyNcclTransport {
  std::unique_ptr<MpiTransport> control;
  std::unique_ptr<NcclTransport> nccl;
  cudaStream_t stream = nullptr;

  static PyNcclTransport Create(int device, double join_timeout) {
    PyNcclTransport t;
    t.control =
        Value(MpiTransport::CreateWorld(TransportOptions(true, join_timeout, std::nullopt)));
    Check(CudaStatus(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")")));
    Check(CudaStatus(cudaStreamCreateWithFlags(&t.stream, cudaStreamNonBlocking),
                     "cudaStreamCreate"));
    NcclTransportOptions o;
    o.synchronize = true;
    absl::StatusOr<std::unique_ptr<NcclTransport>> n;
    {
      py::gil_scoped_release nogil;
      n = NcclTransport::CreateWithMpi(MPI_COMM_WORLD, device, t.stream, t.control.get(), o);
    }
    t.nccl = Value(std::move(n));
    return t;
  }
  // Device work queued before the exchange (e.g. the encoder's outputs on
  // torch's stream) must finish first.
  Transport& transport() {
    Check(CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize before the exchange"));
    return *nccl;
  }
};
#else
#define TUTTI_HAVE_NCCL_PY false
#endif

// ---- Client ---------------------------------------------------------------

class PyClient {
 public:
  PyClient(std::optional<std::string> stager, std::optional<std::string> packer,
           std::optional<int> rank, std::optional<int> world_size,
           std::optional<int64_t> start_step, double connect_timeout, double batch_timeout,
           double join_timeout) {
    ClientOptions o;
    if (stager) o.stager_address = *stager;
    if (packer) o.packer_address = *packer;
    if (rank) o.rank = *rank;
    if (world_size) o.world_size = *world_size;
    if (start_step) o.start_step = *start_step;
    o.connect_timeout = absl::Seconds(connect_timeout);
    o.batch_timeout = absl::Seconds(batch_timeout);
    join_timeout_ = join_timeout;
    absl::StatusOr<std::unique_ptr<Client>> c;
    {
      py::gil_scoped_release nogil;
      c = Client::Connect(o);
    }
    client_ = Value(std::move(c));
  }

  PyBatch next() {
    absl::StatusOr<Batch> b;
    {
      py::gil_scoped_release nogil;
      b = client_->Next();
    }
    Batch batch = Value(std::move(b));
    last_plan_ = batch.plan();
    last_step_ = batch.step();
    return PyBatch(std::move(batch));
  }
  PyBatch iter_next() {
    try {
      return next();
    } catch (const StatusError& e) {
      if (absl::IsOutOfRange(e.status)) throw py::stop_iteration();
      throw;
    }
  }

  void exchange(const py::object& send, const py::object& recv, PyBatch* batch,
                ExchangeDirection dir) {
    Transport& t = transport();
    if (batch != nullptr) {
      const Batch& b = batch->batch();
      RunExchange(t, dir, b.plan(), send, recv, ExchangeContext{b.step(), client_->world_size()});
      return;
    }
    if (!last_plan_) {
      Throw(absl::FailedPreconditionError(
          "no batch yet: call next() before exchange(), or pass batch="));
    }
    RunExchange(t, dir, *last_plan_, send, recv,
                ExchangeContext{last_step_, client_->world_size()});
  }

  void report_timing(uint64_t step, const std::map<std::string, double>& phases) {
    std::vector<PhaseTime> p(phases.begin(), phases.end());
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      s = client_->ReportTiming(step, p);
    }
    Check(s);
  }

  Client& client() { return *client_; }

 private:
  Transport& transport() {
    if (client_->transport() == nullptr) {
      auto t = MpiTransport::CreateWorld(TransportOptions(true, join_timeout_, std::nullopt));
      client_->SetTransport(Value(std::move(t)));
    }
    return *client_->transport();
  }

  std::unique_ptr<Client> client_;
  std::optional<v1::RankPlan> last_plan_;
  uint64_t last_step_ = kUnknownStep;
  double join_timeout_ = 600;
};

}  // namespace

PYBIND11_MODULE(tutti, m) {
  m.doc() =
      "tutti client: batches from the node's stager as zero-copy numpy views, and the step\n"
      "plan's all-to-all exchange over MPI. See help(tutti.Client).";
  RegisterExceptions(m);

  py::class_<PyBatch>(m, "Batch",
                      "One rank's batch for one step. Arrays are read-only numpy views of shared\n"
                      "memory (no copy); release() (or leaving a `with` block) hands the memory\n"
                      "back to the stager, which may then overwrite it.")
      .def_property_readonly("step", &PyBatch::step_)
      .def_property_readonly("rank", &PyBatch::rank_)
      .def_property_readonly("max_pixels", [](PyBatch& b) { return b.raw().max_pixels(); })
      .def_property_readonly("seq_len", [](PyBatch& b) { return b.raw().seq_len(); })
      .def_property_readonly(
          "wait_seconds", [](PyBatch& b) { return b.raw().wait_seconds(); },
          "seconds next() waited for this batch")
      .def_property_readonly("released", [](PyBatch& b) { return b.raw().released(); })
      .def_property_readonly("arrays", &PyBatch::arrays, "name -> numpy array (read-only view)")
      .def_property_readonly("dtypes", &PyBatch::dtypes,
                             "name -> tutti dtype ('bfloat16' arrays are numpy uint16)")
      .def_property_readonly("pixel_values", [](PyBatch& b) { return b.array("pixel_values"); })
      .def_property_readonly("image_grid_thw", [](PyBatch& b) { return b.array("image_grid_thw"); })
      .def_property_readonly("image_sample_ids",
                             [](PyBatch& b) { return b.array("image_sample_ids"); })
      .def_property_readonly("input_ids", [](PyBatch& b) { return b.array("input_ids"); })
      .def_property_readonly("cu_seqlens", [](PyBatch& b) { return b.array("cu_seqlens"); })
      .def_property_readonly("seq_offsets", [](PyBatch& b) { return b.array("seq_offsets"); })
      .def_property_readonly("micro_batch_offsets",
                             [](PyBatch& b) { return b.array("micro_batch_offsets"); })
      .def_property_readonly("doc_sample_ids", [](PyBatch& b) { return b.array("doc_sample_ids"); })
      .def_property_readonly(
          "plan", [](PyBatch& b) { return ProtoToDict(b.batch().plan()); },
          "this rank's plan (tutti.v1.RankPlan) as a dict")
      .def_property_readonly(
          "plan_bytes", [](PyBatch& b) { return py::bytes(b.batch().plan().SerializeAsString()); },
          "this rank's plan as a serialized tutti.v1.RankPlan")
      .def_property_readonly("samples",
                             [](PyBatch& b) {
                               py::list l;
                               for (const auto& s : b.batch().samples()) l.append(ProtoToDict(s));
                               return l;
                             })
      .def_property_readonly("skipped",
                             [](PyBatch& b) {
                               py::list l;
                               for (const auto& s : b.batch().skipped()) l.append(ProtoToDict(s));
                               return l;
                             })
      .def("release", &PyBatch::release, "hand the batch back to the stager (once)")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyBatch& b, py::args) { b.release(); })
      .def("__repr__", [](PyBatch& b) {
        return absl::StrCat("<tutti.Batch step=", b.step_(), " rank=", b.rank_(),
                            b.raw().released() ? " released" : "", ">");
      });

  m.def(
      "map_batch",
      [](const py::handle& descriptor) {
        v1::BatchDescriptor d;
        Check(ProtoFromPython(descriptor, &d));
        return PyBatch(Value(Batch::Map(std::move(d))));
      },
      py::arg("descriptor"),
      "Maps a batch segment described by a tutti.v1.BatchDescriptor (dict or serialized bytes)\n"
      "without a stager lease (inspecting a segment, tests).");

  // The same three exchanges on every transport class.
  auto exchanges = [](auto& cls, bool device) {
    using T = typename std::remove_reference_t<decltype(cls)>::type;
    const char* where = device ? "CUDA tensors (__cuda_array_interface__)"
                               : "host buffers (buffer protocol or __array_interface__)";
    for (const auto& [name, dir, doc] :
         {std::tuple<const char*, ExchangeDirection, const char*>{
              "exchange", ExchangeDirection::kForward,
              "Forward exchange of `plan` (a tutti.v1.RankPlan as dict or bytes): `send` holds "
              "the plan's sends back to back, `recv` receives its recvs. Sizes are checked "
              "first. Buffers: "},
          {"exchange_backward", ExchangeDirection::kBackward,
           "The inverse exchange (gradients): `send` has the forward receive layout, `recv` "
           "the send layout. Buffers: "},
          {"exchange_load", ExchangeDirection::kLoad,
           "The plan's load exchange (inputs whose shard this node does not stage), laid out "
           "like the forward one; every rank calls it. Buffers: "}}) {
      const ExchangeDirection d = dir;
      cls.def(
          name,
          [d, device](T& t, const py::handle& plan, const py::object& send, const py::object& recv,
                      std::optional<uint64_t> step, std::optional<uint32_t> world_size) {
            RunExchange(t.transport(), d, PlanFrom(plan), send, recv,
                        ExchangeContext{step.value_or(kUnknownStep), world_size.value_or(0)},
                        device);
          },
          py::arg("plan"), py::arg("send"), py::arg("recv"), py::arg("step") = py::none(),
          py::arg("world_size") = py::none(), absl::StrCat(doc, where).c_str());
    }
  };

  py::class_<PyMpiTransport> mpi(
      m, "MpiTransport",
      "The plan's all-to-all over MPI on host memory (initialises MPI if needed). Collective:\n"
      "every rank must call exchanges in the same order. Buffers: numpy arrays or any object\n"
      "with the buffer protocol or __array_interface__ (torch CPU tensors: t.numpy()).");
  mpi.def(py::init([](bool verify, double join_timeout, std::optional<uint64_t> max_count) {
            return PyMpiTransport{Value(
                MpiTransport::CreateWorld(TransportOptions(verify, join_timeout, max_count)))};
          }),
          py::arg("verify") = true, py::arg("join_timeout") = 600.0,
          py::arg("max_count") = py::none())
      .def_property_readonly("rank", [](PyMpiTransport& t) { return t.mpi->rank(); })
      .def_property_readonly("world_size", [](PyMpiTransport& t) { return t.mpi->world_size(); })
      .def_property_readonly("large_exchanges",
                             [](PyMpiTransport& t) { return t.mpi->large_exchanges(); });
  exchanges(mpi, false);
  m.attr("HAVE_NCCL") = py::bool_(TUTTI_HAVE_NCCL_PY);
#if TUTTI_HAVE_NCCL
  py::class_<PyNcclTransport> nccl(
      m, "NcclTransport",
      "The plan's all-to-all on CUDA device memory: grouped ncclSend/ncclRecv, one NCCL\n"
      "communicator over MPI_COMM_WORLD (one rank per GPU: NCCL refuses two ranks on one\n"
      "device), agreement over MPI first. Buffers: CUDA tensors or any object with\n"
      "__cuda_array_interface__. Each exchange waits for the device (cudaDeviceSynchronize)\n"
      "before it starts and for its stream before it returns.");
  nccl.def(py::init([](int device, double join_timeout) {
             return PyNcclTransport::Create(device, join_timeout);
           }),
           py::arg("device") = 0, py::arg("join_timeout") = 600.0)
      .def_property_readonly("rank", [](PyNcclTransport& t) { return t.nccl->rank(); })
      .def_property_readonly("world_size", [](PyNcclTransport& t) { return t.nccl->world_size(); });
  exchanges(nccl, true);
#endif

  py::class_<PyClient>(
      m, "Client",
      "A rank's connection to its node's tutti-stagerd and the job's\n"
      "tutti-packerd. Unset arguments come from TUTTI_STAGER, TUTTI_PACKER,\n"
      "TUTTI_RANK (or OMPI_COMM_WORLD_RANK, ...), TUTTI_WORLD_SIZE, TUTTI_START_STEP.")
      .def(py::init<std::optional<std::string>, std::optional<std::string>, std::optional<int>,
                    std::optional<int>, std::optional<int64_t>, double, double, double>(),
           py::arg("stager") = py::none(), py::arg("packer") = py::none(),
           py::arg("rank") = py::none(), py::arg("world_size") = py::none(),
           py::arg("start_step") = py::none(), py::arg("connect_timeout") = 60.0,
           py::arg("batch_timeout") = 600.0, py::arg("join_timeout") = 600.0)
      .def("next", &PyClient::next,
           "the next step's batch (waits; raises OutOfRangeError at the end)")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", &PyClient::iter_next)
      .def(
          "exchange",
          [](PyClient& c, const py::object& send, const py::object& recv, PyBatch* batch) {
            c.exchange(send, recv, batch, ExchangeDirection::kForward);
          },
          py::arg("send"), py::arg("recv"), py::arg("batch") = nullptr,
          "Forward exchange of `batch`'s plan (default: the latest batch from next()). Host\n"
          "buffers: numpy arrays, the buffer protocol or __array_interface__.")
      .def(
          "exchange_backward",
          [](PyClient& c, const py::object& send, const py::object& recv, PyBatch* batch) {
            c.exchange(send, recv, batch, ExchangeDirection::kBackward);
          },
          py::arg("send"), py::arg("recv"), py::arg("batch") = nullptr)
      .def(
          "exchange_load",
          [](PyClient& c, const py::object& send, const py::object& recv, PyBatch* batch) {
            c.exchange(send, recv, batch, ExchangeDirection::kLoad);
          },
          py::arg("send"), py::arg("recv"), py::arg("batch") = nullptr,
          "The plan's load exchange (inputs whose shard this node does not stage).")
      .def("report_timing", &PyClient::report_timing, py::arg("step"), py::arg("phases"),
           "phases: {'data_wait': s, 'vit': s, 'llm': s, 'exchange': s, 'step': s}")
      .def_property_readonly("job", [](PyClient& c) { return ProtoToDict(c.client().job()); })
      .def_property_readonly("rank", [](PyClient& c) { return c.client().rank(); })
      .def_property_readonly("world_size", [](PyClient& c) { return c.client().world_size(); })
      .def_property_readonly("next_step", [](PyClient& c) { return c.client().next_step(); })
      .def_property_readonly("total_wait_seconds",
                             [](PyClient& c) { return c.client().total_wait_seconds(); });
}

}  // namespace tutti::python
