"""Tests of the `tutti` Python module (run with PYTHONPATH=<build>/python)."""
import gc
import os
import socket
import unittest
from multiprocessing import shared_memory

import numpy as np

import tutti

ROW = 3 * 2 * 14 * 14  # values per patch


class Segment:
    """Lays arrays out in a real shared-memory segment as stager.proto says
    (in order, each 64-byte aligned) and builds the BatchDescriptor dict."""

    count = 0

    def __init__(self):
        self.arrays = []

    def add(self, name, dtype, values, tutti_dtype=None):
        self.arrays.append((name, np.ascontiguousarray(values, dtype=dtype), tutti_dtype))
        return self

    def write(self, step=3, rank=1):
        offset, layout = 0, []
        for name, a, td in self.arrays:
            layout.append((name, a, td, offset))
            offset = (offset + a.nbytes + 63) // 64 * 64
        Segment.count += 1
        name = f"tutti-pytest-{os.getpid()}-{Segment.count}"
        self.shm = shared_memory.SharedMemory(name=name, create=True, size=max(offset, 64))
        descs = []
        for name_, a, td, off in layout:
            np.frombuffer(self.shm.buf, dtype=a.dtype, count=a.size, offset=off)[:] = a.ravel()
            descs.append({"name": name_, "dtype": td or {np.float32: "DTYPE_FLOAT32", np.int32: "DTYPE_INT32",
                                                         np.int64: "DTYPE_INT64"}[a.dtype.type],
                          "shape": list(a.shape), "offset": off, "nbytes": a.nbytes})
        return {"step": step, "rank": rank, "shm_name": "/" + name, "shm_size": self.shm.size,
                "arrays": descs, "max_pixels": 1003520, "seq_len": 4096,
                "plan": {"rank": rank, "plan_version": 4,
                         "exchange": {"sends": [{"peer": 0, "bytes": 8, "items": [
                             {"sample_id": 2**40 + 5, "bytes": 8}]}], "send_bytes": 8}},
                "samples": [{"sample_id": 2**40 + 5, "key": "000000005", "modality": "MODALITY_VL"}]}

    def close(self):
        self.shm.close()
        self.shm.unlink()


def standard(seg, bf16=False):
    px = np.arange(12 * ROW)
    if bf16:
        seg.add("pixel_values", np.uint16, px.reshape(12, ROW), "DTYPE_BFLOAT16")
    else:
        seg.add("pixel_values", np.float32, (px * 0.5).reshape(12, ROW))
    return (seg.add("image_grid_thw", np.int32, [[1, 2, 2], [1, 2, 4]])
            .add("image_sample_ids", np.int64, [41, 42])
            .add("input_ids", np.int32, [151652, 151655, 151653, 9, 8, 7, 6])
            .add("cu_seqlens", np.int32, [0, 5, 7]))


class BatchTest(unittest.TestCase):
    def setUp(self):
        self.seg = Segment()

    def tearDown(self):
        self.seg.close()

    def test_arrays_are_read_only_zero_copy_views(self):
        batch = tutti.map_batch(standard(self.seg).write())
        self.assertEqual((batch.step, batch.rank, batch.seq_len, batch.max_pixels), (3, 1, 4096, 1003520))
        px = batch.pixel_values
        self.assertEqual(px.shape, (12, ROW))
        self.assertEqual(px.dtype, np.float32)
        self.assertEqual(px[0, 3], 1.5)
        np.testing.assert_array_equal(batch.image_grid_thw, [[1, 2, 2], [1, 2, 4]])
        self.assertEqual(batch.image_grid_thw.dtype, np.int32)
        self.assertEqual(batch.image_sample_ids.dtype, np.int64)
        np.testing.assert_array_equal(batch.input_ids, [151652, 151655, 151653, 9, 8, 7, 6])
        np.testing.assert_array_equal(batch.cu_seqlens, [0, 5, 7])
        self.assertIsNone(batch.doc_sample_ids)
        self.assertIs(batch.arrays["input_ids"], batch.input_ids)
        self.assertFalse(px.flags.writeable)
        self.assertFalse(px.flags.owndata)
        self.assertIsNotNone(px.base)
        with self.assertRaises(ValueError):
            px[0, 0] = 1.0
        # No copy: a write through the writer's mapping shows in the view.
        writer = np.frombuffer(self.seg.shm.buf, dtype=np.float32, count=4)
        writer[3] = -7.0
        self.assertEqual(px[0, 3], -7.0)
        self.assertEqual(px.ctypes.data % 64, 0)
        del writer

    def test_views_outlive_the_batch_object(self):
        batch = tutti.map_batch(standard(self.seg).write())
        ids = batch.input_ids
        del batch
        gc.collect()
        np.testing.assert_array_equal(ids, [151652, 151655, 151653, 9, 8, 7, 6])

    def test_bfloat16_is_uint16_with_a_dtype_note(self):
        batch = tutti.map_batch(standard(self.seg, bf16=True).write())
        self.assertEqual(batch.pixel_values.dtype, np.uint16)
        self.assertEqual(batch.dtypes["pixel_values"], "bfloat16")
        self.assertEqual(batch.dtypes["input_ids"], "int32")
        self.assertEqual(batch.pixel_values[0, 9], 9)

    def test_plan_and_samples_as_python_values(self):
        batch = tutti.map_batch(standard(self.seg).write())
        plan = batch.plan
        self.assertEqual(plan["rank"], 1)
        self.assertEqual(plan["exchange"]["sends"][0]["items"][0]["sample_id"], 2**40 + 5)
        self.assertEqual(plan["exchange"]["send_bytes"], 8)
        self.assertIsNone(plan["cost"])
        self.assertIsInstance(batch.plan_bytes, bytes)
        self.assertGreater(len(batch.plan_bytes), 0)
        self.assertEqual(batch.samples[0]["modality"], "MODALITY_VL")
        self.assertEqual(batch.samples[0]["key"], "000000005")
        self.assertEqual(batch.skipped, [])

    def test_release_ends_access(self):
        with tutti.map_batch(standard(self.seg).write()) as batch:
            self.assertIn("step=3", repr(batch))
        self.assertTrue(batch.released)
        with self.assertRaises(tutti.FailedPreconditionError) as ctx:
            batch.arrays
        self.assertIn("step 3, rank 1: the batch was released", str(ctx.exception))
        self.assertEqual(ctx.exception.code, "FAILED_PRECONDITION")

    def test_fields_of_a_released_batch_raise_views_taken_before_stay(self):
        batch = tutti.map_batch(standard(self.seg).write())
        ids = batch.input_ids  # cached view
        batch.release()
        for field in ("input_ids", "pixel_values", "plan", "arrays"):
            with self.assertRaises(tutti.FailedPreconditionError):
                getattr(batch, field)
        np.testing.assert_array_equal(ids, [151652, 151655, 151653, 9, 8, 7, 6])

    def test_copy_on_write_views_are_writable_and_private(self):
        batch = tutti.map_batch(standard(self.seg).write(), copy_on_write=True)
        px = batch.writable_arrays["pixel_values"]
        self.assertTrue(px.flags.writeable)
        px[0, 3] = 99.0
        self.assertEqual(px[0, 3], 99.0)
        writer = np.frombuffer(self.seg.shm.buf, dtype=np.float32, count=4)
        self.assertEqual(writer[3], 1.5)  # the segment never sees the write
        self.assertEqual(batch.pixel_values[0, 3], 99.0)  # one private mapping per batch
        del writer
        with self.assertRaises(tutti.FailedPreconditionError):
            tutti.map_batch(self.desc_ro()).writable_arrays

    def desc_ro(self):
        seg = Segment()
        self.addCleanup(seg.close)
        return standard(seg).write()

    def test_corrupt_descriptors_are_refused(self):
        desc = standard(self.seg).write()
        desc["arrays"][3]["offset"] = desc["shm_size"]
        with self.assertRaises(tutti.DataLossError) as ctx:
            tutti.map_batch(desc)
        self.assertIn("array 'input_ids' spans bytes", str(ctx.exception))
        desc["shm_name"] = "/tutti-pytest-no-such-segment"
        with self.assertRaises(tutti.NotFoundError):
            tutti.map_batch(desc)
        with self.assertRaises(tutti.InvalidArgumentError):
            tutti.map_batch({"no_such_field": 1})
        with self.assertRaises(ValueError):  # InvalidArgumentError is a ValueError
            tutti.map_batch(42)


def self_plan(n=10):
    items = [{"sample_id": 1, "encoder": "ENCODER_VISION", "bytes": n - 4},
             {"sample_id": 2, "index": 1, "bytes": 4}]
    return {"rank": 0, "plan_version": 4,
            "exchange": {"sends": [{"peer": 0, "bytes": n, "items": items}],
                         "recvs": [{"peer": 0, "bytes": n, "items": items}],
                         "send_bytes": n, "recv_bytes": n}}


def two_encoder_plan():
    """A world of one sending itself an image (6 bytes), an audio clip (4) and an image (2)
    -- images before clips, as plan_version 4 lists a pair -- its encoder phases in that
    order."""
    items = [{"sample_id": 1, "encoder": "ENCODER_VISION", "bytes": 6},
             {"sample_id": 3, "encoder": "ENCODER_VISION", "bytes": 2},
             {"sample_id": 2, "encoder": "ENCODER_AUDIO", "bytes": 4}]
    return {"rank": 0, "plan_version": 4,
            "encoders": [{"encoder": "ENCODER_VISION",
                          "images": [{"sample_id": 1}, {"sample_id": 3}]},
                         {"encoder": "ENCODER_AUDIO", "audio": [{"sample_id": 2}]}],
            "exchange": {"sends": [{"peer": 0, "bytes": 12, "items": items}],
                         "recvs": [{"peer": 0, "bytes": 12, "items": items}],
                         "send_bytes": 12, "recv_bytes": 12}}


class ExchangeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.t = tutti.MpiTransport(join_timeout=30)

    def test_world_of_one(self):
        self.assertEqual((self.t.rank, self.t.world_size), (0, 1))

    def test_forward_and_backward_with_numpy_buffers(self):
        send = np.arange(10, dtype=np.uint8)
        recv = np.zeros(10, dtype=np.uint8)
        self.t.exchange(self_plan(), send, recv, step=4, world_size=1)
        np.testing.assert_array_equal(recv, send)
        back = np.zeros(5, dtype=np.uint16)  # any dtype: bytes are counted
        self.t.exchange_backward(self_plan(), np.arange(5, dtype=np.uint16) * 3, back)
        np.testing.assert_array_equal(back, np.arange(5) * 3)

    def test_buffer_size_mismatch_names_expected_and_given(self):
        with self.assertRaises(tutti.InvalidArgumentError) as ctx:
            self.t.exchange(self_plan(), np.zeros(9, np.uint8), np.zeros(10, np.uint8), step=4)
        self.assertIn("step 4, rank 0, forward exchange: send buffer size mismatch: expected 10 bytes",
                      str(ctx.exception))
        self.assertIn("given 9", str(ctx.exception))
        self.assertEqual(ctx.exception.code, "INVALID_ARGUMENT")

    def test_buffers_must_be_contiguous_and_recv_writable(self):
        with self.assertRaises(tutti.InvalidArgumentError) as ctx:
            self.t.exchange(self_plan(), np.zeros(20, np.uint8)[::2], np.zeros(10, np.uint8))
        self.assertIn("C-contiguous", str(ctx.exception))
        ro = np.zeros(10, np.uint8)
        ro.flags.writeable = False
        with self.assertRaises(tutti.InvalidArgumentError) as ctx:
            self.t.exchange(self_plan(), np.zeros(10, np.uint8), ro)
        self.assertIn("writable", str(ctx.exception))
        self.t.exchange(self_plan(), bytes(10), bytearray(10))  # any buffer works

    def test_array_interface_objects_are_accepted(self):
        class Exporter:  # e.g. a tensor library's host array: no buffer protocol
            def __init__(self, a):
                self._a = a
                self.__array_interface__ = a.__array_interface__

        send = Exporter(np.arange(5, dtype=np.uint16))
        recv = Exporter(np.zeros(5, dtype=np.uint16))
        self.t.exchange(self_plan(), send, recv)
        np.testing.assert_array_equal(recv._a, np.arange(5))
        ro = np.zeros(10, np.uint8)
        ro.flags.writeable = False
        with self.assertRaises(tutti.InvalidArgumentError) as ctx:
            self.t.exchange(self_plan(), np.zeros(10, np.uint8), Exporter(ro))
        self.assertIn("must be writable", str(ctx.exception))
        with self.assertRaises(tutti.InvalidArgumentError) as ctx:
            self.t.exchange(self_plan(), Exporter(np.zeros(20, np.uint8)[::2]), np.zeros(10, np.uint8))
        self.assertIn("not C-contiguous", str(ctx.exception))

    def test_unsupported_and_device_buffers_are_refused_clearly(self):
        with self.assertRaises(tutti.InvalidArgumentError) as ctx:
            self.t.exchange(self_plan(), [0] * 10, np.zeros(10, np.uint8))
        self.assertIn("(list) is not a buffer", str(ctx.exception))
        self.assertIn("t.numpy()", str(ctx.exception))

        class FakeCuda:  # what a CUDA tensor exposes
            __cuda_array_interface__ = {"data": (1 << 40, False), "shape": (10,), "typestr": "|u1",
                                        "version": 3}

        with self.assertRaises(tutti.InvalidArgumentError) as ctx:
            self.t.exchange(self_plan(), FakeCuda(), np.zeros(10, np.uint8))
        self.assertIn("CUDA device memory", str(ctx.exception))
        self.assertIn("NcclTransport" if tutti.HAVE_NCCL else "no NCCL transport", str(ctx.exception))

    def test_an_old_layout_plan_is_refused_naming_both_versions(self):
        plan = self_plan()
        plan["plan_version"] = 3
        with self.assertRaises(tutti.FailedPreconditionError) as ctx:
            self.t.exchange(plan, np.zeros(10, np.uint8), np.zeros(10, np.uint8), step=6)
        self.assertIn("step 6, rank 0, forward exchange: the plan is plan_version 3 but this "
                      "client's exchange needs plan_version 4 or later", str(ctx.exception))
        del plan["plan_version"]
        with self.assertRaisesRegex(tutti.FailedPreconditionError, "plan_version 0 but"):
            tutti.exchange_layout(plan, "forward", 0, 1)

    def test_one_encoders_items_from_that_encoders_output(self):
        plan = tutti.plan_bytes(two_encoder_plan())  # converted once, as tutti.torch does
        vision = np.arange(8, dtype=np.uint8)  # [image 1 | image 3]: the vision output
        got = np.zeros(8, np.uint8)
        self.t.exchange(plan, vision, got, encoder="vision")
        np.testing.assert_array_equal(got, vision)
        audio = np.arange(4, dtype=np.uint8) + 100
        got = np.zeros(4, np.uint8)
        self.t.exchange_backward(plan, audio, got, encoder="audio")
        np.testing.assert_array_equal(got, audio)
        self.assertEqual(list(self.t.messages_sent_to), [0])  # its own rows: a copy
        lay = tutti.exchange_layout(plan, "forward", 0, 1, encoder="vision")
        self.assertEqual((lay["send_counts"], lay["recv_bytes"]), ([8], 8))
        every = tutti.exchange_layout(plan, "forward", 0, 1)
        self.assertEqual(every["send_counts"], [12])
        self.assertNotEqual(lay["send_item_hashes"], every["send_item_hashes"])
        with self.assertRaises(tutti.InvalidArgumentError) as ctx:
            self.t.exchange(plan, np.zeros(12, np.uint8), np.zeros(12, np.uint8), encoder="vision")
        self.assertIn("expected 8 bytes", str(ctx.exception))
        with self.assertRaisesRegex(tutti.InvalidArgumentError, "encoder must be None"):
            self.t.exchange(plan, vision, got, encoder="text")
        # A vision output out of the sends' order is refused as corrupt.
        swapped = two_encoder_plan()
        images = swapped["encoders"][0]["images"]
        images[0], images[1] = images[1], images[0]
        with self.assertRaisesRegex(tutti.InvalidArgumentError, "not grouped by destination"):
            self.t.exchange(swapped, vision, np.zeros(8, np.uint8), encoder="vision")

    def test_counts_plan(self):
        plan = tutti.counts_plan(0, [5], [5])
        send, recv = np.arange(5, dtype=np.uint8), np.zeros(5, np.uint8)
        self.t.exchange(plan, send, recv, step=1)
        np.testing.assert_array_equal(recv, send)

    def test_load_exchange(self):
        empty = {"rank": 0, "plan_version": 4}
        self.t.exchange_load(empty, np.zeros(0, np.uint8), np.zeros(0, np.uint8))
        plan = {"rank": 0, "plan_version": 4, "load_exchange": self_plan()["exchange"]}
        recv = np.zeros(10, np.uint8)
        self.t.exchange_load(plan, np.arange(10, dtype=np.uint8), recv, step=2, world_size=1)
        np.testing.assert_array_equal(recv, np.arange(10))

    def test_plan_for_another_world_size(self):
        with self.assertRaises(tutti.FailedPreconditionError) as ctx:
            self.t.exchange(self_plan(), np.zeros(10, np.uint8), np.zeros(10, np.uint8), world_size=2)
        self.assertIn("the plan is for 2 ranks but the communicator has 1", str(ctx.exception))

    def test_plan_as_serialized_bytes(self):
        seg = Segment()
        try:
            batch = tutti.map_batch(standard(seg).write(rank=0))
            plan_bytes = batch.plan_bytes
        finally:
            seg.close()
        # That plan sends 8 bytes to rank 0 but receives nothing: refused as corrupt.
        with self.assertRaises(tutti.InvalidArgumentError) as ctx:
            self.t.exchange(plan_bytes, np.zeros(8, np.uint8), np.zeros(0, np.uint8))
        self.assertIn("sends 8 bytes to this rank itself but receives 0", str(ctx.exception))


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ClientTest(unittest.TestCase):
    def test_missing_addresses_are_named(self):
        saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("TUTTI_")}
        try:
            with self.assertRaises(tutti.InvalidArgumentError) as ctx:
                tutti.Client()
            self.assertIn("TUTTI_STAGER", str(ctx.exception))
        finally:
            os.environ.update(saved)

    def test_unreachable_packer(self):
        packer = f"127.0.0.1:{closed_port()}"
        with self.assertRaises(tutti.UnavailableError) as ctx:
            tutti.Client(stager="127.0.0.1:1", packer=packer, rank=0, world_size=1, connect_timeout=0.3)
        self.assertIn(f"GetJob from tutti-packerd at {packer}", str(ctx.exception))
        self.assertIsInstance(ctx.exception, ConnectionError)


if __name__ == "__main__":
    unittest.main()
