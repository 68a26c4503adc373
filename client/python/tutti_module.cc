// The Python binding, `tutti._tutti`; `import tutti` (the package in
// client/python/tutti, built into <build>/python) re-exports it, and
// `tutti.torch` builds on it.
//
//   client = tutti.Client(stager="127.0.0.1:7071", packer="127.0.0.1:7070",
//                         rank=0, world_size=4, start_step=0)
//   for batch in client:                    # or client.next()
//       px = batch.pixel_values             # numpy view of shared memory (no copy)
//       ...
//       client.exchange(send, recv, batch)  # the step's all-to-all (MPI)
//       batch.release()                     # or `with client.next() as batch:`
//
// Arrays are read-only numpy views of the stager's shared memory (mapped
// copy-on-write: batch.writable_arrays gives writable views whose writes stay
// in this process); each keeps the mapping alive, so a view never dangles and
// keeps its contents (the stager writes every batch into a new segment).
// Fields of a released batch raise. bfloat16 has no numpy dtype: such arrays
// are uint16 with batch.dtypes[name] == "bfloat16" (tutti.torch gives them
// as torch.bfloat16).
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
#include "client/python/buffers.h"
#include "client/python/proto_dict.h"
#include "client/python/py_status.h"
#include "common/dtype.h"
#include "tutti/v1/packer.pb.h"
#include "tutti/v1/stager.pb.h"
#if TUTTI_HAVE_NCCL
#include "client/nccl_transport.h"
#endif

namespace tutti::python {
namespace {

namespace py = pybind11;

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

// A numpy array over `v`, whose base keeps the mapping alive; read-only
// unless `writable` (a copy-on-write mapping: writes stay in this process).
py::array View(const ArrayView& v, std::shared_ptr<const ShmSegment> segment, bool writable) {
  auto* held = new std::shared_ptr<const ShmSegment>(std::move(segment));
  py::capsule base(held,
                   [](void* p) { delete static_cast<std::shared_ptr<const ShmSegment>*>(p); });
  std::vector<py::ssize_t> shape(v.shape.begin(), v.shape.end());
  py::array a(NumpyDType(v.dtype), shape, v.data, base);
  if (!writable)
    py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return a;
}

// ---- Batch ----------------------------------------------------------------

class PyBatch {
 public:
  PyBatch(Batch batch, bool copy_on_write)
      : batch_(std::make_unique<Batch>(std::move(batch))), copy_on_write_(copy_on_write) {}
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

  // Views of a released batch are refused, cached or not: its memory may
  // hold what the stager wrote before, never what the caller expects next.
  py::dict arrays() {
    const Batch& b = batch();
    if (!arrays_) {
      py::dict d;
      for (const ArrayView& v : b.arrays()) d[py::str(v.name)] = View(v, b.segment(), false);
      arrays_ = d;
    }
    return *arrays_;
  }
  // Writable views (new each call) over the copy-on-write mapping.
  py::dict writable_arrays() {
    const Batch& b = batch();
    if (!copy_on_write_) {
      Throw(absl::FailedPreconditionError(absl::StrCat(
          ExchangeWhere(step_(), rank_()),
          ": the batch is mapped read-only; writable views need a copy-on-write mapping "
          "(map_batch(..., copy_on_write=True); tutti.Client maps every batch so)")));
    }
    py::dict d;
    for (const ArrayView& v : b.arrays()) d[py::str(v.name)] = View(v, b.segment(), true);
    return d;
  }
  // The ArrayDesc of each array (name -> dict), as the stager laid them out.
  py::list layout() {
    const Batch& b = batch();
    py::list l;
    for (const v1::ArrayDesc& a : b.descriptor().arrays()) l.append(ProtoToDict(a));
    return l;
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
  bool copy_on_write_ = false;
  std::optional<py::dict> arrays_;
};

// ---- transports and exchanges ----------------------------------------------

// The scratch_recv keyword of every exchange (ExchangeContext.scratch_recv).
constexpr const char* kScratchRecvDoc =
    "scratch_recv: the receive buffer is scratch, read only when the exchange succeeds (default "
    "False); the MPI transport then posts its receives with its sends, before the ranks agree, "
    "so that large messages move during the agreement. A failed exchange still fails on every "
    "rank alike but may have written into the receive buffer, and after a DEADLINE_EXCEEDED a "
    "late peer may still write into it: keep the send and receive buffers alive until the "
    "process ends.";

v1::RankPlan PlanFrom(const py::handle& plan) {
  v1::RankPlan p;
  Check(ProtoFromPython(plan, &p));
  return p;
}

// Runs one exchange of `plan` in direction `dir` between Python buffers;
// `device`: the transport moves device memory (NCCL), else host memory.
// A buffer this rank cannot use is refused inside the agreement, so that the
// other ranks fail with the reason rather than wait for this one.
void RunExchange(Transport& t, ExchangeDirection dir, const v1::RankPlan& plan,
                 const py::object& send, const py::object& recv, ExchangeContext ctx,
                 bool device = false) {
  Buffer s, r;
  try {
    CheckBuffers(send, recv, device, &s, &r);
  } catch (const StatusError& e) {
    if (ctx.refusal.ok()) ctx.refusal = e.status;
    s = Buffer();
    r = Buffer();
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

// The item-wise exchange: each item of the direction's send (receive) list at
// a byte offset of `src` (`dst`); -1: no memory (zeros sent, arrivals dropped).
void RunItems(Transport& t, ExchangeDirection dir, const v1::RankPlan& plan, const py::object& src,
              const std::vector<int64_t>& send_offsets, const py::object& dst,
              const std::vector<int64_t>& recv_offsets, ExchangeContext ctx, bool device) {
  Buffer s, r;
  try {
    CheckBuffers(src, dst, device, &s, &r);
  } catch (const StatusError& e) {
    if (ctx.refusal.ok()) ctx.refusal = e.status;
  }
  const v1::Exchange& ex = dir == ExchangeDirection::kLoad ? plan.load_exchange() : plan.exchange();
  const auto& send_list = dir == ExchangeDirection::kBackward ? ex.recvs() : ex.sends();
  const auto& recv_list = dir == ExchangeDirection::kBackward ? ex.sends() : ex.recvs();
  auto items = [&](const google::protobuf::RepeatedPtrField<v1::Transfer>& list,
                   const std::vector<int64_t>& offsets, const Buffer& b, const char* what) {
    std::vector<ItemBuffer> out;
    size_t k = 0;
    for (const v1::Transfer& tr : list) {
      for (const v1::TransferItem& item : tr.items()) {
        ItemBuffer ib;
        ib.bytes = item.bytes();
        const int64_t off = k < offsets.size() ? offsets[k] : -1;
        if (k >= offsets.size() && ctx.refusal.ok()) {
          ctx.refusal = absl::InvalidArgumentError(
              absl::StrCat(ExchangeWhere(ctx.step, t.rank()), ": ", offsets.size(), " ", what,
                           " item offsets but the plan lists more items"));
        } else if (off >= 0 && static_cast<uint64_t>(off) + ib.bytes > b.bytes) {
          if (ctx.refusal.ok()) {
            ctx.refusal = absl::InvalidArgumentError(absl::StrCat(
                ExchangeWhere(ctx.step, t.rank()), ": ", what, " item ", k, " at byte ", off,
                " of ", ib.bytes, " bytes ends past its ", b.bytes, "-byte buffer"));
          }
        } else if (off >= 0) {
          ib.data = static_cast<char*>(b.ptr) + off;
        }
        out.push_back(ib);
        ++k;
      }
    }
    if (offsets.size() > k && ctx.refusal.ok()) {
      // Offsets for items the plan does not have: the caller's item list is not the plan's.
      ctx.refusal = absl::InvalidArgumentError(
          absl::StrCat(ExchangeWhere(ctx.step, t.rank()), ": ", offsets.size(), " ", what,
                       " item offsets but the plan lists ", k, " items"));
    }
    return out;
  };
  const std::vector<ItemBuffer> send = items(send_list, send_offsets, s, "send");
  const std::vector<ItemBuffer> recv = items(recv_list, recv_offsets, r, "receive");
  absl::Status status;
  {
    py::gil_scoped_release nogil;
    status = t.ExchangeItems(plan, dir, send, recv, ctx);
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

// A refusal's status from its code name ("INVALID_ARGUMENT", ...).
absl::Status RefusalStatus(const std::string& code, const std::string& message) {
  for (int c = 1; c <= 16; ++c) {
    const auto sc = static_cast<absl::StatusCode>(c);
    if (absl::StatusCodeToString(sc) == code) return absl::Status(sc, message);
  }
  Throw(absl::InvalidArgumentError(absl::StrCat("refusal_code '", code, "' is not a status code")));
}

// ---- Client ---------------------------------------------------------------

class PyClient {
 public:
  PyClient(std::optional<std::string> stager, std::optional<std::string> packer,
           std::optional<int> rank, std::optional<int> world_size,
           std::optional<int64_t> start_step, double connect_timeout, double batch_timeout,
           double join_timeout, const py::object& progress, double progress_interval) {
    ClientOptions o;
    if (stager) o.stager_address = *stager;
    if (packer) o.packer_address = *packer;
    if (rank) o.rank = *rank;
    if (world_size) o.world_size = *world_size;
    if (start_step) o.start_step = *start_step;
    o.connect_timeout = absl::Seconds(connect_timeout);
    o.batch_timeout = absl::Seconds(batch_timeout);
    o.copy_on_write = true;  // writable views (torch tensors) without touching the segment
    if (!progress.is_none()) {
      // Called on the waiting thread, which holds no GIL; the callable is
      // dropped with the GIL held wherever the last copy of the options goes.
      std::shared_ptr<py::object> fn(new py::object(progress), [](py::object* f) {
        py::gil_scoped_acquire gil;
        delete f;
      });
      o.progress_interval = absl::Seconds(progress_interval);
      o.progress = [fn](const WaitProgress& p) {
        py::gil_scoped_acquire gil;
        try {
          (*fn)(p.step, p.waited_seconds, p.waiting_for);
        } catch (py::error_already_set& e) {
          e.discard_as_unraisable("tutti.Client progress callback");
        }
      };
    }
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
    return PyBatch(Value(std::move(b)), /*copy_on_write=*/true);
  }
  PyBatch iter_next() {
    try {
      return next();
    } catch (const StatusError& e) {
      if (absl::IsOutOfRange(e.status)) throw py::stop_iteration();
      throw;
    }
  }

  // Exchanges `batch`'s plan. A released batch is refused inside the
  // agreement (its plan is still known), so every rank fails, none waits.
  void exchange(const py::object& send, const py::object& recv, PyBatch& batch,
                ExchangeDirection dir) {
    Transport& t = transport();
    const Batch& b = batch.raw();
    ExchangeContext ctx{b.step(), client_->world_size()};
    if (b.released()) {
      ctx.refusal = absl::FailedPreconditionError(absl::StrCat(
          ExchangeWhere(b.step(), b.rank()),
          ": exchange of a released batch (exchange before release(), or before leaving "
          "the `with` block)"));
    }
    RunExchange(t, dir, b.plan(), send, recv, ctx);
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
  double join_timeout_ = 600;
};

}  // namespace

PYBIND11_MODULE(_tutti, m) {
  m.doc() =
      "tutti client: batches from the node's stager as zero-copy numpy views, and the step\n"
      "plan's all-to-all exchange over MPI. See help(tutti.Client).";
  RegisterExceptions(m);

  py::class_<PyBatch>(m, "Batch",
                      "One rank's batch for one step. Arrays are read-only numpy views of shared\n"
                      "memory (no copy); release() (or leaving a `with` block) hands the memory\n"
                      "back to the stager. Views taken before keep the memory mapped and its\n"
                      "contents as they were (the stager writes each batch into a new segment);\n"
                      "fields of a released batch raise FailedPreconditionError.")
      .def_property_readonly("step", &PyBatch::step_)
      .def_property_readonly("rank", &PyBatch::rank_)
      .def_property_readonly("max_pixels", [](PyBatch& b) { return b.raw().max_pixels(); })
      .def_property_readonly("seq_len", [](PyBatch& b) { return b.raw().seq_len(); })
      .def_property_readonly(
          "wait_seconds", [](PyBatch& b) { return b.raw().wait_seconds(); },
          "seconds next() waited for this batch")
      .def_property_readonly("released", [](PyBatch& b) { return b.raw().released(); })
      .def_property_readonly("arrays", &PyBatch::arrays, "name -> numpy array (read-only view)")
      .def_property_readonly("writable_arrays", &PyBatch::writable_arrays,
                             "name -> numpy array over the copy-on-write mapping (new views each\n"
                             "call): writes stay in this process")
      .def_property_readonly("layout", &PyBatch::layout,
                             "the stager's ArrayDesc of every array (name, dtype, shape, offset)")
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
      [](const py::handle& descriptor, bool copy_on_write) {
        v1::BatchDescriptor d;
        Check(ProtoFromPython(descriptor, &d));
        return PyBatch(Value(Batch::Map(std::move(d), nullptr, copy_on_write)), copy_on_write);
      },
      py::arg("descriptor"), py::arg("copy_on_write") = false,
      "Maps a batch segment described by a tutti.v1.BatchDescriptor (dict or serialized bytes)\n"
      "without a stager lease (inspecting a segment, tests); copy_on_write as tutti.Client maps.");

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
                      std::optional<uint64_t> step, std::optional<uint32_t> world_size,
                      std::optional<std::string> refusal, const std::string& refusal_code,
                      bool scratch_recv) {
            ExchangeContext ctx{step.value_or(kUnknownStep), world_size.value_or(0)};
            if (refusal) ctx.refusal = RefusalStatus(refusal_code, *refusal);
            ctx.scratch_recv = scratch_recv;
            RunExchange(t.transport(), d, PlanFrom(plan), send, recv, ctx, device);
          },
          py::arg("plan"), py::arg("send"), py::arg("recv"), py::arg("step") = py::none(),
          py::arg("world_size") = py::none(), py::arg("refusal") = py::none(),
          py::arg("refusal_code") = "INVALID_ARGUMENT", py::arg("scratch_recv") = false,
          absl::StrCat(doc, where,
                       ". refusal: this rank cannot take part (the reason); it still joins the "
                       "agreement so that every rank fails with it (refusal_code: the status "
                       "code name). ",
                       kScratchRecvDoc)
              .c_str());
    }
  };

  auto item_exchange = [](auto& cls, bool device) {
    using T = typename std::remove_reference_t<decltype(cls)>::type;
    cls.def(
        "exchange_items",
        [device](T& t, const py::handle& plan, const std::string& direction, const py::object& src,
                 const std::vector<int64_t>& send_offsets, const py::object& dst,
                 const std::vector<int64_t>& recv_offsets, std::optional<uint64_t> step,
                 std::optional<uint32_t> world_size, bool scratch_recv) {
          ExchangeDirection d = ExchangeDirection::kForward;
          if (direction == "backward")
            d = ExchangeDirection::kBackward;
          else if (direction == "load")
            d = ExchangeDirection::kLoad;
          else if (direction != "forward") {
            Throw(absl::InvalidArgumentError("direction must be forward, backward or load"));
          }
          ExchangeContext ctx{step.value_or(kUnknownStep), world_size.value_or(0)};
          ctx.scratch_recv = scratch_recv;
          RunItems(t.transport(), d, PlanFrom(plan), src, send_offsets, dst, recv_offsets, ctx,
                   device);
        },
        py::arg("plan"), py::arg("direction"), py::arg("src"), py::arg("send_offsets"),
        py::arg("dst"), py::arg("recv_offsets"), py::arg("step") = py::none(),
        py::arg("world_size") = py::none(), py::arg("scratch_recv") = false,
        absl::StrCat(
            "The exchange item by item, in place: item k of the direction's send list\nis read "
            "at byte send_offsets[k] of `src`, receive item k written at recv_offsets[k]\nof "
            "`dst` (-1: zeros sent / arrival dropped); sizes from the plan, checked. A run of\n"
            "a pair's items (Transfer.runs) moves as one message; one whose offsets are not "
            "back to\nback here is staged through the transport's own memory. ",
            kScratchRecvDoc)
            .c_str());
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
  item_exchange(mpi, false);
  m.attr("HAVE_NCCL") = py::bool_(TUTTI_HAVE_NCCL_PY);
  m.def(
      "exchange_layout",
      [](const py::handle& plan, const std::string& direction, uint32_t rank, uint32_t world_size,
         std::optional<uint64_t> step, std::optional<uint32_t> plan_world_size) {
        ExchangeDirection dir = ExchangeDirection::kForward;
        if (direction == "backward") {
          dir = ExchangeDirection::kBackward;
        } else if (direction == "load") {
          dir = ExchangeDirection::kLoad;
        } else if (direction != "forward") {
          Throw(absl::InvalidArgumentError(
              absl::StrCat("direction must be forward, backward or load, got '", direction, "'")));
        }
        const ExchangeContext ctx{step.value_or(kUnknownStep), plan_world_size.value_or(0)};
        ExchangeLayout l = Value(BuildExchangeLayout(PlanFrom(plan), dir, rank, world_size, ctx));
        py::dict d;
        d["send_counts"] = l.send_counts;
        d["send_offsets"] = l.send_offsets;
        d["recv_counts"] = l.recv_counts;
        d["recv_offsets"] = l.recv_offsets;
        d["send_bytes"] = l.send_bytes;
        d["recv_bytes"] = l.recv_bytes;
        return d;
      },
      py::arg("plan"), py::arg("direction"), py::arg("rank"), py::arg("world_size"),
      py::arg("step") = py::none(), py::arg("plan_world_size") = py::none(),
      "The byte layout of `plan`'s exchange for `rank` of `world_size` (per-peer counts and\n"
      "offsets), checked as every transport checks it (INVALID_ARGUMENT / FAILED_PRECONDITION)");
  m.def(
      "mpi_world",
      [] {
        Check(EnsureMpiInitialized());
        int rank = 0, size = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        return std::make_pair(rank, size);
      },
      "(rank, size) in MPI_COMM_WORLD (initialises MPI if needed)");
  m.def(
      "mpi_broadcast",
      [](const py::bytes& data, int root) {
        Check(EnsureMpiInitialized());
        std::string buf = data;
        uint64_t n = buf.size();
        {
          py::gil_scoped_release nogil;
          Check(MpiStatus(MPI_Bcast(&n, 1, MPI_UINT64_T, root, MPI_COMM_WORLD), "MPI_Bcast"));
          buf.resize(n);
          Check(
              MpiStatus(MPI_Bcast(buf.data(), static_cast<int>(n), MPI_BYTE, root, MPI_COMM_WORLD),
                        "MPI_Bcast"));
        }
        return py::bytes(buf);
      },
      py::arg("data"), py::arg("root") = 0,
      "`root`'s bytes on every rank of MPI_COMM_WORLD (collective; small messages, e.g. a\n"
      "rendezvous address)");
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
                    std::optional<int>, std::optional<int64_t>, double, double, double,
                    const py::object&, double>(),
           py::arg("stager") = py::none(), py::arg("packer") = py::none(),
           py::arg("rank") = py::none(), py::arg("world_size") = py::none(),
           py::arg("start_step") = py::none(), py::arg("connect_timeout") = 60.0,
           py::arg("batch_timeout") = 600.0, py::arg("join_timeout") = 600.0,
           py::arg("progress") = py::none(), py::arg("progress_interval") = 10.0,
           "progress: called as progress(step, waited_seconds, waiting_for) every\n"
           "progress_interval seconds while connecting (step -1) or next() waits, the first\n"
           "time one interval in (a quick call reports nothing); waiting_for says what the\n"
           "batch still waits for, as the stager tells it, or which daemon does not answer.")
      .def("next", &PyClient::next,
           "the next step's batch (waits; raises OutOfRangeError at the end)")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", &PyClient::iter_next)
      .def(
          "exchange",
          [](PyClient& c, const py::object& send, const py::object& recv, PyBatch& batch) {
            c.exchange(send, recv, batch, ExchangeDirection::kForward);
          },
          py::arg("send"), py::arg("recv"), py::arg("batch"),
          "Forward exchange of `batch`'s plan (every exchange names its batch). Host\n"
          "buffers: numpy arrays, the buffer protocol or __array_interface__.")
      .def(
          "exchange_backward",
          [](PyClient& c, const py::object& send, const py::object& recv, PyBatch& batch) {
            c.exchange(send, recv, batch, ExchangeDirection::kBackward);
          },
          py::arg("send"), py::arg("recv"), py::arg("batch"))
      .def(
          "exchange_load",
          [](PyClient& c, const py::object& send, const py::object& recv, PyBatch& batch) {
            c.exchange(send, recv, batch, ExchangeDirection::kLoad);
          },
          py::arg("send"), py::arg("recv"), py::arg("batch"),
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
