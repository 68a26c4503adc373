"""tutti.torch without daemons: launcher environments, position ids, labels, the
batch's tensors and their lifetime, the agreement's verdicts (PYTHONPATH=<build>/python)."""
import unittest
import warnings

import numpy as np
import torch

from tutti.torch import _synthetic as synthetic
import tutti
import tutti.torch
from tutti.torch import _agree, _rope, _transports

from hf_reference import hf_style_rope


class LaunchEnvTest(unittest.TestCase):
    def test_launchers(self):
        env = tutti.torch.launch_env
        self.assertEqual(env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                              "LOCAL_WORLD_SIZE": "2"}),
                         tutti.torch.LaunchEnv("torchrun", 3, 4, 1, 2))
        self.assertEqual(env({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "8",
                              "OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}),
                         tutti.torch.LaunchEnv("mpirun", 2, 8, 2, 4))
        self.assertEqual(env({"SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_LOCALID": "2",
                              "SLURM_TASKS_PER_NODE": "3(x2)"}),
                         tutti.torch.LaunchEnv("slurm", 5, 6, 2, 3))
        # torchrun inside a Slurm allocation: torchrun's ranks win.
        self.assertEqual(env({"RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "0",
                              "SLURM_NTASKS": "1"}).launcher, "torchrun")
        self.assertEqual(env({}), tutti.torch.LaunchEnv("single", 0, 1, 0, 1))
        with self.assertRaisesRegex(ValueError, "RANK=4 is outside WORLD_SIZE=4"):
            env({"RANK": "4", "WORLD_SIZE": "4"})
        with self.assertRaisesRegex(ValueError, "WORLD_SIZE is not"):
            env({"RANK": "0"})


class RopeTest(unittest.TestCase):
    def test_mrope_matches_get_rope_index(self):
        rng = np.random.default_rng(3)
        for _ in range(200):
            tokens, images, grids = [], [], []
            for _ in range(int(rng.integers(0, 4))):
                tokens += [1] * int(rng.integers(0, 3)) + [synthetic.START]
                g = (1, 2 * int(rng.integers(1, 5)), 2 * int(rng.integers(1, 5)))
                images.append((len(tokens), g))
                grids.append(g)
                tokens += [synthetic.PAD] * (g[1] * g[2] // 4) + [synthetic.END]
            tokens += [2] * int(rng.integers(1, 6))
            want = hf_style_rope(tokens, grids, 2, synthetic.PAD)
            np.testing.assert_array_equal(_rope.mrope_positions(len(tokens), images, 2), want)

    def test_document_positions(self):
        np.testing.assert_array_equal(_rope.document_positions([0, 3], [3, 2], 5), [0, 1, 2, 0, 1])


class BatchTest(unittest.TestCase):
    def make(self, hidden=4):
        rng = np.random.default_rng(5)
        images, llm_of = synthetic.random_step(1, 0, rng)
        while not images:
            images, llm_of = synthetic.random_step(1, 1, rng)
        b, seg = synthetic.batch(1, 0, 0, images, llm_of, hidden, _transports.LocalTransport())
        self.addCleanup(seg.close)
        return b

    def test_fields_are_zero_copy_tensors_and_die_loudly(self):
        b = self.make()
        px = b.pixel_values
        self.assertEqual(px.dtype, torch.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no writability warning
            ids = b.input_ids
        self.assertEqual(ids.dtype, torch.int32)
        self.assertEqual(b.image_grid_thw.dtype, torch.int64)
        px[0, 0] = -1.0  # writable: copy-on-write, private to this process
        self.assertEqual(b.pixel_values[0, 0].item(), -1.0)
        b.release()
        for field in ("pixel_values", "input_ids", "plan"):
            with self.assertRaises(tutti.FailedPreconditionError):
                getattr(b, field)
        with self.assertRaises(tutti.FailedPreconditionError):
            b.micro_batches[0].labels
        self.assertEqual(px[0, 0].item(), -1.0)  # taken before: still valid
        self.assertEqual(int(ids[0]), synthetic.START)

    def test_model_inputs(self):
        b = self.make()
        total = 0
        for mb in b.micro_batches:
            ids, labels = mb.input_ids[0].long(), mb.labels[0]
            cu = mb.cu_seqlens.long()
            self.assertEqual(labels.dtype, torch.int64)
            special = (ids == synthetic.START) | (ids == synthetic.PAD) | (ids == synthetic.END)
            self.assertTrue(bool((labels[special] == -100).all()))
            self.assertTrue(bool((labels[cu[:-1]] == -100).all()))
            keep = ~special
            keep[cu[:-1]] = False
            self.assertTrue(torch.equal(labels[keep], ids[keep]))
            pos = mb.position_ids[0]
            for k in range(len(cu) - 1):
                self.assertTrue(torch.equal(pos[cu[k]:cu[k + 1]], torch.arange(int(cu[k + 1] - cu[k]))))
            self.assertEqual(tuple(mb.mrope_position_ids.shape), (3, 1, mb.num_tokens))
            self.assertTrue(bool((ids[mb.image_token_positions] == synthetic.PAD).all()))
            total += len(mb.image_token_positions)
        self.assertEqual(total, b.num_image_embeds)

    def test_interleaved_documents(self):
        """Image runs inside the text (schema 2): image tokens found where the runs are, in
        order; M-RoPE per document as get_rope_index gives it; labels -100 outside the
        trained spans on top of the other masks."""
        rng = np.random.default_rng(11)
        images, llm_of = synthetic.random_step(1, 0, rng)
        while sum(1 for im in images if im[1] == 1) == 0:  # a document with two images
            images, llm_of = synthetic.random_step(1, 0, rng)
        b, seg = synthetic.batch(1, 0, 0, images, llm_of, 4, _transports.LocalTransport(),
                                 interleave=True)
        self.addCleanup(seg.close)
        L = b._layout
        for mb in b.micro_batches:
            ids, labels = mb.input_ids[0].long(), mb.labels[0]
            pos = mb.image_token_positions
            self.assertTrue(bool((ids[pos] == synthetic.PAD).all()))
            self.assertEqual(len(pos), int((ids == synthetic.PAD).sum()))
            self.assertTrue(bool((pos[1:] > pos[:-1]).all()))
            cu = mb.cu_seqlens.long().tolist()
            d0 = mb._docs[0]
            for k in range(len(cu) - 1):
                doc = ids[cu[k]:cu[k + 1]].tolist()
                if synthetic.PAD in doc:
                    self.assertNotEqual(doc[0], synthetic.START)  # text before its first image
                grids = [g for _, g in L.doc_images[d0 + k]]
                want = hf_style_rope(doc, grids, L.merge, synthetic.PAD)
                np.testing.assert_array_equal(
                    mb.mrope_position_ids[:, 0, cu[k]:cu[k + 1]].numpy(), want)
                # Only each document's last token is trained.
                kept = (labels[cu[k]:cu[k + 1]] != -100).nonzero().flatten().tolist()
                self.assertEqual(kept, [cu[k + 1] - cu[k] - 1])
        # Each image's exchanged rows land on its run inside the text (image_embed_index).
        enc = [(k, n) for k, (_, n) in sorted(L.enc_rows.items(), key=lambda kv: kv[1][0])]
        emb = tutti.torch.exchange(torch.from_numpy(synthetic.pattern(enc, 4, 0)), b)
        for mb in b.micro_batches:
            out = mb.scatter_image_embeds(torch.zeros(1, mb.num_tokens, 4), emb)[0]
            want = np.zeros((mb.num_tokens, 4), np.float32)
            for sid, index, _, at, n in L.llm_images:
                if mb._t0 <= at < mb._t1:
                    want[at - mb._t0:at - mb._t0 + n] = synthetic.pattern([((sid, index), n)], 4, 0)
            np.testing.assert_array_equal(out.detach().numpy(), want)

    def test_local_exchange_and_scatter_with_gradient_accumulation(self):
        b = self.make()
        x = torch.randn(b.num_encoder_rows, 4, requires_grad=True)
        emb = tutti.torch.exchange(x * 1.0, b)
        g_direct = torch.zeros_like(x)
        for mb in b.micro_batches:
            base = torch.zeros(1, mb.num_tokens, 4, requires_grad=True)
            (mb.scatter_image_embeds(base, emb) ** 2).sum().backward()
        # d/dx sum(x^2) = 2x for every row placed once
        placed = torch.zeros(b.num_encoder_rows, dtype=torch.bool)
        placed[:] = True
        g_direct[placed] = 2 * x.detach()[placed]
        self.assertTrue(torch.allclose(x.grad, g_direct))

    def test_bfloat16_pixels_are_torch_bfloat16_without_a_copy(self):
        rng = np.random.default_rng(5)
        images, llm_of = synthetic.random_step(1, 0, rng)
        b, seg = synthetic.batch(1, 0, 0, images, llm_of, 4, _transports.LocalTransport(), bf16=True)
        self.addCleanup(seg.close)
        px = b.pixel_values
        self.assertEqual(px.dtype, torch.bfloat16)
        want = torch.from_numpy(np.concatenate(
            [np.full((gh * gw, synthetic.ROW), s % 251, np.float32) for s, _, gh, gw, _, _ in images]))
        self.assertTrue(torch.equal(px.float(), want))
        self.assertEqual(px.data_ptr(), b.pixel_values.data_ptr())  # one mapping, no copies

    def test_pin_memory_without_cuda_warns_once(self):
        b = self.make()
        if torch.cuda.is_available():
            self.skipTest("CUDA present")
        with self.assertWarnsRegex(UserWarning, "CUDA is not available"):
            self.assertIs(b.pin_memory(), b)


class VerdictTest(unittest.TestCase):
    def view(self, rank, seq=1, step=3, send=(0, 0), recv=(0, 0), refusal=None,
             send_items=(0, 0), recv_items=(0, 0)):
        return {"rank": rank, "seq": seq, "step": step, "direction": "forward", "world": 2,
                "refusal": refusal, "send": list(send), "recv": list(recv),
                "send_items": list(send_items), "recv_items": list(recv_items)}

    def test_everyone_gets_the_same_reason(self):
        v = _agree.verdict
        self.assertEqual(v([self.view(0), self.view(1)]), (None, None))
        code, msg = v([self.view(0), self.view(1, refusal=("INVALID_ARGUMENT", "bad x"))])
        self.assertEqual((code, msg), ("INVALID_ARGUMENT",
                                       "step 3, forward exchange #1: rank 1 refused the exchange: bad x"))
        _, msg = v([self.view(0, seq=2), self.view(1, seq=3)])
        self.assertIn("rank 0 is at exchange #2 but rank 1 at exchange #3", msg)
        _, msg = v([self.view(0, send=(0, 8)), self.view(1, recv=(4, 0))])
        self.assertIn("rank 0 sends 8 bytes to rank 1 but rank 1's plan expects 4", msg)
        # The same bytes, split into other items on the two ends (the C++ layout's hashes).
        _, msg = v([self.view(0, send=(0, 8), send_items=(0, 11)),
                    self.view(1, recv=(8, 0), recv_items=(22, 0))])
        self.assertIn("rank 0 splits the 8 bytes it sends to rank 1 into other items than "
                      "rank 1's plan", msg)


class HostPoolTest(unittest.TestCase):
    """The exchange's CPU outputs come from blocks reused once no tensor uses them."""

    def test_a_freed_output_s_memory_serves_the_next(self):
        pool = _transports._HostPool()
        a = pool.empty((16, 8), torch.float32)
        ptr = a.data_ptr()
        del a
        b = pool.empty((8, 8), torch.float32)  # smaller: the same block
        self.assertEqual(b.data_ptr(), ptr)
        self.assertEqual((b.shape, b.dtype), (torch.Size([8, 8]), torch.float32))

    def test_memory_in_use_is_never_handed_out(self):
        pool = _transports._HostPool()
        a = pool.empty((16, 8), torch.float32)
        a.fill_(3)
        kept = [a[2:5], a.numpy()[1], a.view(torch.uint8)]  # views of every kind
        ptrs = {a.data_ptr()}
        del a
        live = []
        for _ in range(6):
            live.append(pool.empty((16, 8), torch.float32))
            self.assertNotIn(live[-1].data_ptr(), ptrs)
            live[-1].fill_(7)
            ptrs.add(live[-1].data_ptr())
        self.assertTrue(bool((kept[0] == 3).all()))
        self.assertTrue(bool((kept[1] == 3).all()))
        del live, kept
        self.assertIn(pool.empty((16, 8), torch.float32).data_ptr(), ptrs)

    def test_zeroed_on_request_bf16_and_empty_shapes(self):
        pool = _transports._HostPool()
        a = pool.empty((4, 4), torch.float32)
        a.fill_(1)
        del a
        z = pool.empty((4, 4), torch.float32, zero=True)
        self.assertEqual(float(z.abs().sum()), 0.0)
        del z
        h = pool.empty((3, 4), torch.bfloat16)
        self.assertEqual((h.dtype, tuple(h.shape)), (torch.bfloat16, (3, 4)))
        self.assertEqual(tuple(pool.empty((0, 4), torch.float32).shape), (0, 4))

    def test_idle_blocks_are_bounded(self):
        pool = _transports._HostPool(keep=2)
        live = [pool.empty((n, 4), torch.float32) for n in (64, 8, 32, 16)]
        del live
        big = pool.empty((128, 4), torch.float32)  # fits no idle block: the smallest go
        self.assertEqual(sorted(b.nbytes for b in pool.blocks), [1024, 2048])
        del big  # two idle blocks now, the largest
        self.assertEqual(pool.empty((64, 4), torch.float32).data_ptr(),
                         pool.blocks[0].ctypes.data)


def recv_keys(batch):
    """The exchange's output rows, as (key, rows) in order: the plan's receives."""
    out = []
    for t in batch._layout.plan["exchange"]["recvs"]:
        for it in t["items"]:
            key = (int(it["sample_id"]), int(it.get("index") or 0))
            out.append((key, int(it["bytes"]) // batch._layout.row_bytes))
    return out


class LocalExchangeTest(unittest.TestCase):
    """One rank: the exchange's outputs (from the host pool) as the rows arrive, placed in
    input_ids order through the index, the gradient back in encoder order, step after step,
    kept outputs intact."""

    def test_steps_in_reused_memory_keep_their_rows(self):
        hidden = 8
        held = []
        for step in range(12):
            rng = np.random.default_rng(40 + step)
            images, llm_of = synthetic.random_step(1, step, rng)
            b, seg = synthetic.batch(1, 0, step, images, llm_of, hidden,
                                     _transports.LocalTransport())
            try:
                L = b._layout
                enc = [(k, n) for k, (_, n) in sorted(L.enc_rows.items(), key=lambda kv: kv[1][0])]
                llm = [((sid, i), n) for sid, i, _, _, n in L.llm_images]
                x = torch.from_numpy(synthetic.pattern(enc, hidden, 0)).requires_grad_()
                emb = tutti.torch.exchange(x, b)
                np.testing.assert_array_equal(emb.detach().numpy(),
                                              synthetic.pattern(recv_keys(b), hidden, 0))
                np.testing.assert_array_equal(emb.detach()[b.image_embed_index].numpy(),
                                              synthetic.pattern(llm, hidden, 0))
                g = torch.zeros_like(emb)
                g[b.image_embed_index] = torch.from_numpy(synthetic.pattern(llm, hidden, 5))
                emb.backward(g)
                if enc:
                    np.testing.assert_array_equal(x.grad.numpy(), synthetic.pattern(enc, hidden, 5))
                for t, rows in held:
                    np.testing.assert_array_equal(t.numpy(), rows)
                held = [(emb.detach(), emb.detach().numpy().copy())]
            finally:
                b.release()
                seg.close()

    def test_an_old_layout_plan_is_refused_naming_both_versions(self):
        rng = np.random.default_rng(5)
        images, llm_of = synthetic.random_step(1, 0, rng)
        b, seg = synthetic.batch(1, 0, 0, images, llm_of, 4, _transports.LocalTransport(),
                                 plan_version=3)
        self.addCleanup(seg.close)
        x = torch.zeros(b.num_encoder_rows, 4)
        with self.assertRaisesRegex(tutti.FailedPreconditionError,
                                    "the plan is plan_version 3 but this client's exchange needs "
                                    "plan_version 4 or later"):
            tutti.torch.exchange(x, b)

    def test_rows_a_batch_lacks_are_zeros_and_get_no_gradient(self):
        # The fallback path (a sample the stager dropped): send rows gathered from x, the
        # lacking image's rows sent as zeros; the gradient the inverse way.
        from types import SimpleNamespace
        tables = SimpleNamespace(
            send_identity=False, send_total=4, recv_total=4,
            send_index=torch.tensor([2, 0, 1]), send_valid=torch.tensor([1, 1, 0, 1], dtype=bool),
            send_rows=[4], recv_rows=[4])
        transport = _transports.LocalTransport()
        for salt in (1.0, 10.0, 100.0):  # the pool's blocks come back dirty
            x = torch.arange(6, dtype=torch.float32).view(3, 2) + salt
            state = SimpleNamespace(tables=tables, batch=None, x_shape=x.shape)
            out = transport.forward(state, x)
            torch.testing.assert_close(out, torch.stack([x[2], x[0], torch.zeros(2), x[1]]))
            g = torch.arange(8, dtype=torch.float32).view(4, 2) * salt
            grad_x = transport.backward(state, g)
            torch.testing.assert_close(grad_x, torch.stack([g[1], g[3], g[0]]))
            del out, grad_x


class MixtureTest(unittest.TestCase):
    def make(self, sources):
        rng = np.random.default_rng(9)
        images, llm_of = synthetic.random_step(1, 0, rng)
        b, seg = synthetic.batch(1, 0, 0, images, llm_of, 4, _transports.LocalTransport(),
                                 sources=sources)
        self.addCleanup(seg.close)
        self.addCleanup(b.release)
        return b

    def test_documents_say_their_source(self):
        b = self.make(["ocr", "charts", "text"])
        self.assertEqual(b.source_names, ["ocr", "charts", "text"])
        self.assertTrue(torch.equal(b.doc_sources, b.doc_sample_ids % 3))
        for mb in b.micro_batches:
            self.assertEqual(mb.doc_sources.dtype, torch.int64)
            self.assertTrue(torch.equal(mb.doc_sources, mb.doc_sample_ids % 3))
        self.assertEqual(self.make(None).source_names, ["text", "vl"])

    def test_a_changed_mixture_is_refused_unless_told_how_to_go_on(self):
        from tutti.torch import _loader
        before = {"mixture_history": [{"start_step": 0, "fingerprint": "a"},
                                      {"start_step": 100, "fingerprint": "b"}]}
        state = {"next_step": 150, "mixture": _loader._mixture_fingerprint(before, 150)}
        self.assertEqual(state["mixture"], "b")
        self.assertIsNone(_loader._check_mixture(before, state, None))
        # A stage added from the step it resumes at: the steps before drew as they did.
        added = {"mixture_history": before["mixture_history"] + [
            {"start_step": 150, "fingerprint": "c"}]}
        self.assertIsNone(_loader._check_mixture(added, state, None))
        # The stage the steps before were drawn by changed: refused, saying how to go on.
        changed = {"mixture_history": [{"start_step": 0, "fingerprint": "a"},
                                       {"start_step": 100, "fingerprint": "x"}]}
        with self.assertRaises(tutti.FailedPreconditionError) as e:
            _loader._check_mixture(changed, state, None)
        self.assertIn("cannot resume at step 150", str(e.exception))
        self.assertIn("add a stage with start_step >= 150", str(e.exception))
        self.assertIn("mixture_change='continue'", str(e.exception))
        self.assertIn("goes on", _loader._check_mixture(changed, state, "continue"))
        with self.assertRaises(tutti.InvalidArgumentError):
            _loader._check_mixture(changed, state, "restart")
        # A checkpoint from a job without a mixture, resumed with one.
        plain = {"next_step": 20, "mixture": None}
        with self.assertRaises(tutti.FailedPreconditionError):
            _loader._check_mixture(before, plain, None)
        self.assertIsNone(_loader._check_mixture({}, plain, None))


class AudioPositionsTest(unittest.TestCase):
    """Audio clips in the documents: their tokens' positions in input_ids order and which clip
    each run is, where the stager wrote the runs (at their placeholders inside the text, or
    after the image runs); a plan the runs contradict is refused."""

    IMAGES = [(3, 0, 2, 4, 0, 0)]
    LLM_OF = {3: 0, 4: 0, 5: 0}  # sequences [3], [4, 5]: one micro-batch each
    AUDIO = {3: [3, 2], 4: [4]}

    def check(self, interleave):
        b, seg = synthetic.batch(1, 0, 0, self.IMAGES, self.LLM_OF, 4,
                                 _transports.LocalTransport(), interleave=interleave,
                                 audio=self.AUDIO)
        self.addCleanup(seg.close)
        self.addCleanup(b.release)
        clips = []
        for mb in b.micro_batches:
            ids = mb.input_ids[0].long()
            pos = mb.audio_token_positions
            self.assertEqual(pos.tolist(), (ids == synthetic.AUDIO_PAD).nonzero().flatten().tolist())
            self.assertTrue(bool((mb.labels[0, pos] == -100).all()))
            at = 0
            for sid, index, n in mb.audio_clips.tolist():
                run = pos[at:at + n]
                self.assertEqual(run.tolist(), list(range(int(run[0]), int(run[0]) + n)))
                self.assertEqual(int(ids[run[0] - 1]), synthetic.AUDIO_START)
                self.assertEqual(int(ids[run[-1] + 1]), synthetic.AUDIO_END)
                clips.append((sid, index, n))
                at += n
            self.assertEqual(at, len(pos))
        self.assertEqual(clips, [(3, 0, 3), (3, 1, 2), (4, 0, 4)])
        self.assertEqual(b.audio_clips.tolist(), [list(c) for c in clips])
        ids = b.input_ids.long()
        self.assertEqual(b.audio_token_positions.tolist(),
                         (ids == synthetic.AUDIO_PAD).nonzero().flatten().tolist())
        return b

    def test_clips_inside_the_text(self):
        b = self.check(interleave=True)
        first = b.micro_batches[0]
        # Sample 3: 7, its image's run (2 tokens), 8, its two clips, 9.
        self.assertEqual(first.audio_token_positions.tolist(), [7, 8, 9, 12, 13])

    def test_clips_after_the_image_runs(self):
        b = self.check(interleave=False)
        # Sample 3: its image's run (2 tokens), its two clips, 7, 8, 9.
        self.assertEqual(b.micro_batches[0].audio_token_positions.tolist(), [5, 6, 7, 10, 11])

    def test_runs_the_plan_does_not_give_are_refused(self):
        for written, message in (({3: [3], 4: [4]}, "sample 3 holds 3 audio tokens"),
                                 ({3: [3, 2], 4: [4, 1]}, "sample 4 holds 5 audio tokens")):
            plan = synthetic.rank_plan(1, 0, self.IMAGES, self.LLM_OF, 4, audio=self.AUDIO)
            seg = synthetic.Segment(0, 0, plan, self.IMAGES, interleave=True, audio=written)
            self.addCleanup(seg.close)
            raw = tutti.map_batch(seg.desc, copy_on_write=True)
            with self.assertRaises(tutti.DataLossError) as e:
                tutti.torch.Batch(raw, synthetic.job(1, 4))
            self.assertIn(message, str(e.exception))
            raw.release()


class ViewsTest(unittest.TestCase):
    """The typed views of the job and the plan: defaults where the dict leaves a field out or
    holds proto3's zero, the values where it holds them; a batch's own."""

    def test_job_defaults_and_values(self):
        from tutti import views

        j = views.JobInfo.from_dict({"config": {"world_size": 4, "vision": None, "audio": {},
                                                "post_balancing": {"enabled": True}}})
        self.assertEqual((j.world_size, j.vision.image_pad_id, j.vision.merge_size,
                          j.audio.markers, j.post_balancing.hidden_size,
                          j.post_balancing.embedding_dtype, j.source_names, j.has_mixture),
                         (4, 151655, 2, (151647, 151646, 151648), 4096, "DTYPE_BFLOAT16",
                          ("text", "vl"), False))
        j = views.JobInfo.from_dict(synthetic.job(2, 8, sources=["ocr", "chat"]))
        self.assertEqual((j.world_size, j.post_balancing.hidden_size, j.source_names,
                          j.has_mixture), (2, 8, ("ocr", "chat"), True))
        j = views.JobInfo.from_dict({"config": {"vision": {"vision_start_id": 7, "image_pad_id": 8,
                                                           "vision_end_id": 9}},
                                     "mixture_history": [{"start_step": 0, "fingerprint": "a"},
                                                         {"start_step": 5, "fingerprint": "b"}]})
        self.assertEqual(j.vision.markers, (7, 8, 9))
        self.assertEqual(j.mixture_history, ((0, "a"), (5, "b")))

    def test_a_batch_s_plan_and_job(self):
        from tutti import views

        images = [(3, 0, 2, 4, 0, 0), (3, 1, 4, 4, 0, 0)]
        b, seg = synthetic.batch(1, 0, 0, images, {3: 0, 4: 0}, 4, _transports.LocalTransport(),
                                 audio={4: [5]})
        self.addCleanup(seg.close)
        self.addCleanup(b.release)
        self.assertIsInstance(b.job_info, views.JobInfo)
        plan = b.rank_plan
        self.assertEqual(plan.plan_version, 4)
        self.assertEqual([(i.sample_id, i.image_index, i.grid_thw, i.llm_rank)
                          for i in plan.vision_images], [(3, 0, (1, 2, 4), 0), (3, 1, (1, 4, 4), 0)])
        docs = [d for mb in plan.micro_batches for d in mb.docs]
        self.assertEqual([(d.sample_id, d.audio_tokens, [im.llm_tokens for im in d.images])
                          for d in docs], [(3, 0, [2, 4]), (4, 5, [])])
        self.assertEqual(plan.find_doc(4).encoder_tokens, 5)
        self.assertEqual(b.plan, plan.raw)  # the dict API as it was


class SampleTextTest(unittest.TestCase):
    def test_each_document_says_its_sample_s_source_and_meta(self):
        """k.json's source and meta (SampleInfo.sample_source / sample_meta, set by the stager)
        per document, in doc_sample_ids order, batch and micro-batch; "" and {} without."""
        text = {3: {"sample_source": "chartqa", "sample_meta": '{"id":"r3","n":[1,2]}'},
                5: {"sample_source": "", "sample_meta": '{"id":"r5"}'}}
        b, seg = synthetic.batch(1, 0, 0, [(3, 0, 2, 2, 0, 0)], {3: 0, 4: 0, 5: 0}, 4,
                                 _transports.LocalTransport(), text=text)
        self.addCleanup(seg.close)
        self.addCleanup(b.release)
        self.assertEqual(b.doc_sample_ids.tolist(), [3, 4, 5])
        self.assertEqual(b.doc_sample_sources, ["chartqa", "", ""])
        self.assertEqual(b.doc_sample_meta, [{"id": "r3", "n": [1, 2]}, {}, {"id": "r5"}])
        got = [(src, meta) for mb in b.micro_batches
               for src, meta in zip(mb.doc_sample_sources, mb.doc_sample_meta)]
        self.assertEqual(got, list(zip(b.doc_sample_sources, b.doc_sample_meta)))
        self.assertEqual([len(mb.doc_sample_sources) for mb in b.micro_batches], [1, 2])
        b.release()
        with self.assertRaises(tutti.FailedPreconditionError):
            b.doc_sample_meta


class EmptyMicroBatchTest(unittest.TestCase):
    """A micro-batch without documents (4 text / 16 VL samples on 4 ranks leave some rank's
    text micro-batch empty), and a batch without any: every helper gives empty tensors of its
    usual rank and dtype, the exchange and the example trainer's model run through them."""

    def make(self, llm_of, images, **kw):
        b, seg = synthetic.batch(1, 0, 0, images, llm_of, 4, _transports.LocalTransport(),
                                 interleave=True, **kw)
        self.addCleanup(seg.close)
        self.addCleanup(b.release)
        return b

    def check_empty(self, mb):
        self.assertEqual(mb.num_tokens, 0)
        self.assertEqual(mb.max_seqlen, 0)
        self.assertEqual(mb.num_label_tokens, 0)
        want = {"input_ids": ((1, 0), torch.int32), "labels": ((1, 0), torch.int64),
                "position_ids": ((1, 0), torch.int64),
                "mrope_position_ids": ((3, 1, 0), torch.int64),
                "cu_seqlens": ((1,), torch.int32), "doc_sample_ids": ((0,), torch.int64),
                "doc_sources": ((0,), torch.int64), "image_grid_thw": ((0, 3), torch.int64),
                "image_token_positions": ((0,), torch.int64),
                "image_embed_index": ((0,), torch.int64),
                "audio_token_positions": ((0,), torch.int64),
                "audio_clips": ((0, 3), torch.int64)}
        for name, (shape, dtype) in want.items():
            t = getattr(mb, name)
            self.assertEqual((tuple(t.shape), t.dtype), (shape, dtype), name)
        self.assertEqual(mb.cu_seqlens.tolist(), [0])
        self.assertEqual((mb.doc_sample_sources, mb.doc_sample_meta), ([], []))
        self.assertEqual(mb.seq_offsets.tolist(), [0] * len(mb.seq_offsets))

    def run_example_model(self, b):
        """The example trainer's step: encoder, exchange, a scatter, forward and backward
        per micro-batch; returns the encoder input's gradient."""
        import os
        import sys
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                        "examples"))
        import train_vlm

        torch.manual_seed(0)
        vit, lm = train_vlm.VisionEncoder(synthetic.ROW, 8, 4), train_vlm.CausalLM(4, 1, heads=2)
        px = b.pixel_values.clone().requires_grad_()
        emb = tutti.torch.exchange(vit(px, b.vit_cu_seqlens), b)
        self.assertEqual(tuple(emb.shape), (b.num_image_embeds, 4))
        for mb in b.micro_batches:
            h = mb.scatter_image_embeds(lm.embed(train_vlm.fold_ids(mb.input_ids)), emb)
            self.assertEqual(tuple(h.shape), (1, mb.num_tokens, 4))
            logits = lm(h, mb.mrope_position_ids, mb.cu_seqlens)
            labels = mb.labels[:, 1:]
            target = torch.where(labels >= 0, train_vlm.fold_ids(labels.clamp(min=0)), labels)
            loss = torch.nn.functional.cross_entropy(logits[0, :-1], target[0], ignore_index=-100,
                                                     reduction="sum")
            self.assertTrue(bool(torch.isfinite(loss)))
            (loss + 0.0 * h.sum()).backward()
            token_loss = torch.zeros(max(mb.num_tokens - 1, 0))
            sums, counts = torch.zeros(2), torch.zeros(2)
            train_vlm.add_source_losses(mb, token_loss, target[0] != -100, sums, counts)
        return px.grad

    def test_an_empty_micro_batch_beside_a_full_one(self):
        # One sample of two images on the only rank: the plan's first sequence and so its
        # first micro-batch are empty.
        b = self.make({5: 0}, [(5, 0, 2, 4, 0, 0), (5, 1, 4, 2, 0, 0)])
        empty, full = b.micro_batches
        self.check_empty(empty)
        self.assertEqual(full.doc_sample_ids.tolist(), [5])
        self.assertEqual(len(full.image_token_positions), 4)
        tutti.torch.share_skipped_images(b)
        self.assertEqual(b.skipped_images, [])
        grad = self.run_example_model(b)
        self.assertEqual(tuple(grad.shape), tuple(b.pixel_values.shape))
        self.assertGreater(float(grad.abs().sum()), 0.0)

    def test_a_batch_without_documents(self):
        b = self.make({}, [])
        self.assertEqual(len(b.micro_batches), 2)
        for mb in b.micro_batches:
            self.check_empty(mb)
        want = {"pixel_values": (0, synthetic.ROW), "image_grid_thw": (0, 3),
                "image_sample_ids": (0,), "image_indices": (0,), "vit_cu_seqlens": (1,),
                "image_embed_index": (0,), "llm_image_grid_thw": (0, 3), "input_ids": (0,),
                "cu_seqlens": (1,), "doc_sample_ids": (0,), "doc_sources": (0,),
                "audio_token_positions": (0,), "audio_clips": (0, 3)}
        for name, shape in want.items():
            self.assertEqual(tuple(getattr(b, name).shape), shape, name)
        self.assertEqual((b.num_encoder_rows, b.num_image_embeds, b.num_label_tokens,
                          b.vit_max_seqlen), (0, 0, 0, 0))
        tutti.torch.share_skipped_images(b)
        grad = self.run_example_model(b)
        self.assertEqual(tuple(grad.shape), (0, synthetic.ROW))
        moved = b.to("cpu")
        self.check_empty(moved.micro_batches[0])
        self.assertEqual(tuple(moved.input_ids.shape), (0,))


if __name__ == "__main__":
    unittest.main()
