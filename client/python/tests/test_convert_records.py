"""tutti.convert, record by record: LLaVA, chat messages, FineVision and caption records
with 0, 1 and 2 images at different turns give the samples an independent reconstruction
says (tokens of the rendered ChatML, one placeholder where each <image> was, trained
spans over exactly the assistant turns, images numbered in order of appearance); other
templates; every bad-input reason; --strict. Needs PYTHONPATH=<build>/python."""
import base64
import json
import os
import shutil
import tempfile
import unittest

import convert_fixtures as fx
from tutti.convert import ConvertError, ConvertOptions, FormatOptions, ImageLimits, Limits, run
from tutti.convert import REASONS


class ConvertCase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tutti-convert-")
        cls.sp_path = fx.train_sentencepiece(os.path.join(cls.dir, "sp"), fx.CHATML + fx.VISION)
        img = os.path.join(cls.dir, "img")
        os.makedirs(img)
        cls.images = {}
        for name, w, h, fmt in (("a.jpg", 64, 48, "JPEG"), ("b.png", 40, 90, "PNG"),
                                ("c.jpg", 120, 80, "JPEG"), ("d.webp", 50, 50, "WEBP"),
                                ("png_named.jpg", 30, 30, "PNG")):
            cls.images[name] = fx.make_image(os.path.join(img, name), w, h, fmt, seed=len(name))
        cls.n = 0

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    def convert(self, records, name="in.jsonl", **kw):
        """Converts records (written as JSONL unless a path is given); returns the
        report, the manifest and {key: {ext: bytes}}."""
        type(self).n += 1
        path = records if isinstance(records, str) else os.path.join(self.dir, f"{self.n}-{name}")
        if not isinstance(records, str):
            fx.write_jsonl(path, records)
        out = os.path.join(self.dir, f"out{self.n}")
        fmt = {k: kw.pop(k) for k in list(kw) if k in FormatOptions.__dataclass_fields__}
        fmt.setdefault("image_root", self.dir)
        o = ConvertOptions(inputs=[path], out=out, tokenizer=kw.pop("tokenizer", self.sp_path),
                           formats=FormatOptions(**fmt), workers=1, progress="never", **kw)
        report = run(o)
        manifest, samples = fx.read_shards(out)
        return report, manifest, samples

    def reference(self, manifest):
        return fx.Reference(self.sp_path, manifest["placeholders"]["image"])

    def check_sample(self, sample, ref, turns):
        ids, trained, images = ref.sample(turns)
        doc = json.loads(sample["json"])
        self.assertEqual(sample["json"], json.dumps(doc, sort_keys=True, separators=(",", ":"),
                                                    ensure_ascii=False).encode())
        self.assertEqual(doc["schema"], 2)
        self.assertEqual(doc["input_ids"], ids)
        self.assertEqual(doc["trained"], trained)
        placeholder = ref.placeholder
        self.assertEqual(doc["input_ids"].count(placeholder), len(images))
        for b, e in doc["trained"]:
            self.assertNotIn(placeholder, doc["input_ids"][b:e])
        members = sorted(k for k in sample if k != "json")
        self.assertEqual(len(members), len(images))
        for i, path in enumerate(images):
            (member,) = [m for m in members if m.startswith(f"{i}.")]
            with open(path, "rb") as f:
                self.assertEqual(sample[member], f.read(), f"image {i} is {path}")
        return doc


class FormatsTest(ConvertCase):
    def test_llava_0_1_2_images_at_different_turns(self):
        records = [
            {"id": "text", "conversations": [
                {"from": "human", "value": "what is the color of the sky"},
                {"from": "gpt", "value": "blue"},
                {"from": "human", "value": "and the tree"},
                {"from": "gpt", "value": "green"}]},
            {"id": "one-first", "image": "img/a.jpg", "conversations": [
                {"from": "human", "value": "<image>\nwhat is in this image"},
                {"from": "gpt", "value": "a red cat sits on the mat"}]},
            {"id": "one-second-turn", "image": "img/b.png", "conversations": [
                {"from": "system", "value": "describe it"},
                {"from": "human", "value": "is there a dog"},
                {"from": "gpt", "value": "no"},
                {"from": "human", "value": "what is in this picture <image> left or right"},
                {"from": "gpt", "value": "a house on the left"}]},
            {"id": "two", "images": ["img/c.jpg", "img/d.webp"], "conversations": [
                {"from": "human", "value": "<image>\ndescribe it"},
                {"from": "gpt", "value": "a big tree"},
                {"from": "human", "value": "and this one"},
                {"from": "gpt", "value": "small"},
                {"from": "human", "value": "now <image> what color"},
                {"from": "gpt", "value": "green and blue"}]},
        ]
        report, manifest, samples = self.convert(records, source="llava-mix")
        self.assertEqual(report.total.samples, 4)
        ref = self.reference(manifest)
        self.assertEqual(manifest["placeholders"]["image"], manifest["markers"]["image_pad"])
        self.assertEqual(manifest["markers"]["image_pad"], ref.sp.piece_to_id("<|image_pad|>"))
        for i, r in enumerate(records):
            doc = self.check_sample(samples[f"{i:09d}"], ref, fx.llava_turns(r, self.dir))
            self.assertEqual(doc["source"], "llava-mix")
            self.assertEqual(doc["meta"], {"id": r["id"]})
        # Images keep their place: the 2-image sample's second image comes after the
        # text of turn 5, not ahead of the conversation.
        ids = json.loads(samples["000000003"]["json"])["input_ids"]
        first, second = [i for i, t in enumerate(ids) if t == ref.placeholder]
        self.assertGreater(second - first, 10)
        self.assertEqual(sorted(samples["000000003"]), ["0.jpg", "1.webp", "json"])

    def test_messages_typed_parts_inline_listed_and_tagged(self):
        records = [
            {"messages": [
                {"role": "user", "content": [{"type": "text", "text": "what is in this image"},
                                             {"type": "image", "image": "img/a.jpg"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "a cat"}]},
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and here"}]},
                {"role": "assistant", "content": "a dog"}],
             "images": ["img/b.png"]},
            {"messages": [
                {"role": "system", "content": "describe it"},
                {"role": "user", "content": "<image> is it big"},
                {"role": "assistant", "content": "yes"}],
             "images": ["img/c.jpg"]},
            {"messages": [
                {"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64," +
                                                        base64.b64encode(self.images["b.png"]).decode()}},
                    {"type": "text", "text": "color"}]},
                {"role": "assistant", "content": "blue"}]},
        ]
        report, manifest, samples = self.convert(records)
        self.assertEqual(report.total.samples, 3, report.total.examples)
        ref = self.reference(manifest)
        a, b, c = (("image", os.path.join(self.dir, "img", n)) for n in ("a.jpg", "b.png", "c.jpg"))
        self.check_sample(samples["000000000"], ref, [
            ("user", ["what is in this image", a]), ("assistant", ["a cat"]),
            ("user", [b, "and here"]), ("assistant", ["a dog"])])
        self.check_sample(samples["000000001"], ref, [
            ("system", ["describe it"]), ("user", [c, " is it big"]), ("assistant", ["yes"])])
        self.check_sample(samples["000000002"], ref, [
            ("user", [b, "color"]), ("assistant", ["blue"])])

    def test_finevision_images_lead_the_first_turn_or_sit_at_their_tags(self):
        records = [
            {"images": ["img/a.jpg", "img/b.png"], "source": "chartqa",
             "texts": [{"user": "what is in this image", "assistant": "two cats"},
                       {"user": "which is big", "assistant": "the left one"}]},
            {"images": ["img/c.jpg"],
             "texts": [{"user": "describe it", "assistant": "a tree"},
                       {"user": "and now <image> this", "assistant": "a house"}]},
            {"images": [], "texts": [{"user": "yes or no", "assistant": "yes"}]},
            # Rows exported from HF datasets: images as {"bytes": base64, "path"}.
            {"images": [{"bytes": base64.b64encode(self.images["d.webp"]).decode(), "path": "x.webp"}],
             "texts": [{"user": "what", "assistant": "a tree"}]},
        ]
        report, manifest, samples = self.convert(records)
        self.assertEqual(report.total.samples, 4, report.total.examples)
        ref = self.reference(manifest)
        a, b, c, d = (("image", os.path.join(self.dir, "img", n)) for n in ("a.jpg", "b.png", "c.jpg", "d.webp"))
        self.check_sample(samples["000000003"], ref, [("user", [d, "what"]), ("assistant", ["a tree"])])
        doc = self.check_sample(samples["000000000"], ref, [
            ("user", [a, b, "what is in this image"]), ("assistant", ["two cats"]),
            ("user", ["which is big"]), ("assistant", ["the left one"])])
        self.assertEqual(doc["source"], "chartqa")
        self.check_sample(samples["000000001"], ref, [
            ("user", ["describe it"]), ("assistant", ["a tree"]),
            ("user", ["and now ", c, " this"]), ("assistant", ["a house"])])
        self.check_sample(samples["000000002"], ref, [("user", ["yes or no"]), ("assistant", ["yes"])])

    def test_captions_from_jsonl_and_webdataset_chat_and_plain(self):
        wds = os.path.join(self.dir, "captions.tar")
        fx.write_wds(wds, [
            ("s0", {"jpg": self.images["a.jpg"], "txt": b"a red cat"}),
            ("s1", {"png": self.images["b.png"], "json": json.dumps({"caption": "a blue sky", "id": 7}).encode()}),
            ("s2", {"txt": b"two dogs"}),
        ])
        report, manifest, samples = self.convert(wds)
        # A caption without an image has no question in chat style.
        self.assertEqual(report.total.samples, 2, report.total.examples)
        self.assertEqual(report.total.skipped, {"one_sided_conversation": 1})
        ref = self.reference(manifest)
        a = ("image", os.path.join(self.dir, "img", "a.jpg"))
        self.check_sample(samples["000000000"], ref, [("user", [a]), ("assistant", ["a red cat"])])
        self.assertEqual(json.loads(samples["000000001"]["json"])["meta"], {"id": 7})
        self.assertEqual(samples["000000001"]["0.png"], self.images["b.png"])
        # Plain: images, caption, EOS; the caption and EOS trained.
        report, manifest, samples = self.convert(
            [{"image": "img/a.jpg", "caption": "a red cat"}], caption_style="plain")
        doc = json.loads(samples["000000000"]["json"])
        caption = ref.sp.encode("a red cat")
        self.assertEqual(doc["input_ids"], [ref.placeholder] + caption + [ref.sp.eos_id()])
        self.assertEqual(doc["trained"], [[1, len(caption) + 2]])

    def test_image_extension_from_its_bytes(self):
        report, manifest, samples = self.convert([{"image": "img/png_named.jpg", "conversations": [
            {"from": "human", "value": "<image>"}, {"from": "gpt", "value": "a cat"}]}])
        self.assertEqual(sorted(samples["000000000"]), ["0.png", "json"])

    def test_markers_appended_after_a_vocabulary_without_them(self):
        sp_path = fx.train_sentencepiece(os.path.join(self.dir, "plain"), fx.CHATML)
        report, manifest, samples = self.convert([{"image": "img/a.jpg", "conversations": [
            {"from": "human", "value": "<image>what"}, {"from": "gpt", "value": "a cat"}]}],
            tokenizer=sp_path)
        import sentencepiece
        size = sentencepiece.SentencePieceProcessor(model_file=sp_path).get_piece_size()
        self.assertEqual(manifest["markers"], {
            "vision_start": size, "image_pad": size + 1, "vision_end": size + 2,
            "audio_start": size + 3, "audio_pad": size + 4, "audio_end": size + 5})
        self.assertEqual(manifest["placeholders"], {"image": size + 1, "audio": size + 4})
        self.assertEqual(manifest["tokenizer"]["vocab_size"], size + 6)
        self.assertEqual(manifest["tokenizer"]["kind"], "sentencepiece")
        ids = json.loads(samples["000000000"]["json"])["input_ids"]
        self.assertEqual(ids.count(size + 1), 1)
        self.assertTrue(all(i < size for i in ids if i != size + 1))
        # Given vision ids past the vocabulary: the audio ids come after them.
        report, manifest, samples = self.convert([{"conversations": [
            {"from": "human", "value": "what"}, {"from": "gpt", "value": "a cat"}]}],
            tokenizer=sp_path, vision_ids=[size + 10, size + 11, size + 12])
        self.assertEqual([manifest["markers"][k] for k in ("audio_start", "audio_pad", "audio_end")],
                         [size + 13, size + 14, size + 15])
        self.assertEqual(manifest["tokenizer"]["vocab_size"], size + 16)
        with self.assertRaisesRegex(ConvertError, "marker ids must be distinct"):
            self.convert([], tokenizer=sp_path, vision_ids=[5, 5, 6])


class ShardFormatTest(unittest.TestCase):
    def test_member_headers_are_tarfiles_with_fixed_metadata(self):
        import tarfile

        from tutti.convert.shards import member_header
        for name, size in (("000000001.json", 123), ("000000001.10.webp", 8 ** 11 - 1),
                           ("k" * 100, 0), ("\u00e9" * 30, 5)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode, info.uname, info.gname = size, 0, 0o644, "", ""
            self.assertEqual(member_header(name, size), info.tobuf(format=tarfile.USTAR_FORMAT))


class TokenSpansTest(unittest.TestCase):
    def test_character_spans_map_to_the_tokens_overlapping_them(self):
        # The Hugging Face adapter's mapping, on the offsets a real tokenizer gives
        # (SentencePiece's, with its zero-width dummy prefix and multi-character pieces).
        import sentencepiece

        from tutti.convert.tokenizer import token_spans
        with tempfile.TemporaryDirectory() as d:
            sp = sentencepiece.SentencePieceProcessor(
                model_file=fx.train_sentencepiece(os.path.join(d, "sp"), fx.CHATML))
        text = "<|im_start|>user\nwhat is in this image<|im_end|>\n<|im_start|>assistant\na red cat<|im_end|>"
        pieces = sp.encode(text, out_type="immutable_proto").pieces
        offsets = [(p.begin, p.end) for p in pieces]
        answer = text.index("a red cat")
        for b, e in ((answer, len(text)), (0, 5), (answer + 2, answer + 5), (3, 3)):
            (first, last), = token_spans(offsets, [(b, e)])
            overlapping = [i for i, (tb, te) in enumerate(offsets) if tb < e and te > b]
            if overlapping:
                self.assertEqual((first, last), (overlapping[0], overlapping[-1] + 1), (b, e))
            else:
                self.assertEqual(first, last)


class TemplatesTest(ConvertCase):
    RECORD = {"image": "img/a.jpg", "conversations": [
        {"from": "human", "value": "<image>\nwhat is in this image"},
        {"from": "gpt", "value": " a red cat "},
        {"from": "human", "value": "and the dog"},
        {"from": "gpt", "value": "left"}]}

    def template_file(self, text, name):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def chatml_without_generation(self, trim=False):
        from tutti.convert.template import DEFAULT_TEMPLATE
        text = DEFAULT_TEMPLATE.replace("{%- generation %}", "").replace("{%- endgeneration %}", "")
        if trim:
            text = text.replace("{{- text + '<|im_end|>' }}", "{{- text | trim + '<|im_end|>' }}")
        return text

    def spans_as_text(self, samples, sp):
        doc = json.loads(samples["000000000"]["json"])
        return [sp.decode([i for i in doc["input_ids"][b:e] if i < sp.get_piece_size()])
                for b, e in doc["trained"]]

    def test_without_generation_blocks_the_turns_are_found_by_marks_and_by_prefixes(self):
        ref_sp = None
        for trim in (False, True):  # trim: the marks change the text, prefixes decide
            path = self.template_file(self.chatml_without_generation(trim), f"t{trim}.jinja")
            report, manifest, samples = self.convert([self.RECORD], chat_template=path)
            self.assertEqual(report.total.samples, 1, report.total.examples)
            ref_sp = self.reference(manifest).sp
            # Without blocks a turn runs to the end of what the template writes for it.
            content = "a red cat" if trim else " a red cat "
            self.assertEqual(self.spans_as_text(samples, ref_sp),
                             [ref_sp.decode(ref_sp.encode(content + "<|im_end|>\n")),
                              ref_sp.decode(ref_sp.encode("left<|im_end|>\n"))])

    def test_marked_turns_equal_prefix_rendering_where_the_marks_apply(self):
        from datetime import datetime

        from tutti.convert.template import ChatTemplate
        for trim, marks_apply in ((False, True), (True, False)):
            t = ChatTemplate(self.chatml_without_generation(trim), {}, datetime(2024, 1, 1))
            messages = [t.message("user", ["what"]), t.message("assistant", [" a cat "]),
                        t.message("user", ["and"]), t.message("assistant", ["yes"])]
            text = t.render(messages)
            marked = t._marked_spans(messages, [1, 3], text)
            prefixes = t._prefix_spans(messages, [1, 3], text)
            self.assertEqual([text[b:e] for b, e in prefixes],
                             [("a cat" if trim else " a cat ") + "<|im_end|>\n", "yes<|im_end|>\n"])
            self.assertEqual(marked, prefixes if marks_apply else None)

    def test_a_template_that_is_not_prefix_stable_skips_the_record(self):
        # The last assistant turn is written differently from earlier ones.
        text = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}"
                "{% if loop.last %}!{% endif %}\n{% endfor %}"
                "{% if add_generation_prompt %}assistant: {% endif %}")
        path = self.template_file(text, "unstable.jinja")
        report, manifest, samples = self.convert([self.RECORD], chat_template=path)
        self.assertEqual(report.total.skipped, {"template_error": 1})
        self.assertIn("not a prefix", report.total.examples["template_error"][0])

    def test_string_content_template_with_control_tokens(self):
        # Llama-2 style: string content, <s> and </s> from the tokenizer's specials.
        text = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] "
                "{{ m['content'] }} [/INST]{% elif m['role'] == 'assistant' %}{% generation %}"
                " {{ m['content'] }} {{ eos_token }}{% endgeneration %}{% endif %}{% endfor %}")
        path = self.template_file(text, "llama.jinja")
        report, manifest, samples = self.convert([self.RECORD], chat_template=path)
        self.assertEqual(report.total.samples, 1, report.total.examples)
        ref = self.reference(manifest)
        sp = ref.sp
        doc = json.loads(samples["000000000"]["json"])
        enc = sp.encode
        expected = ([sp.bos_id()] + enc("[INST] ") + [ref.placeholder] + enc("\nwhat is in this image [/INST]")
                    + enc("  a red cat  ") + [sp.eos_id()] + enc("[INST] and the dog [/INST]")
                    + enc(" left ") + [sp.eos_id()])
        self.assertEqual(doc["input_ids"], expected)
        n1 = 1 + len(enc("[INST] ")) + 1 + len(enc("\nwhat is in this image [/INST]"))
        n2 = n1 + len(enc("  a red cat  ")) + 1
        n3 = n2 + len(enc("[INST] and the dog [/INST]"))
        self.assertEqual(doc["trained"], [[n1, n2], [n3, len(expected)]])

    def test_template_from_a_tokenizer_config_and_template_vars(self):
        text = ("{% for m in messages %}{{ greeting }} {{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}{{ greeting }} {% endif %}")
        path = self.template_file(json.dumps({"chat_template": text}), "tokenizer_config.json")
        report, manifest, samples = self.convert(
            [{"conversations": [{"from": "human", "value": "yes"}, {"from": "gpt", "value": "no"}]}],
            chat_template=path, template_vars={"greeting": "the"})
        sp = self.reference(manifest).sp
        self.assertEqual(self.spans_as_text(samples, sp), [sp.decode(sp.encode("no\n"))])


class BadInputTest(ConvertCase):
    def bad_records(self):
        ok = [{"from": "human", "value": "what"}, {"from": "gpt", "value": "a cat"}]
        with open(os.path.join(self.dir, "img", "corrupt.jpg"), "wb") as f:
            f.write(self.images["a.jpg"][:20] + b"\0" * 10)
        fx.make_image(os.path.join(self.dir, "img", "anim.gif"), 8, 8, "GIF")
        fx.make_image(os.path.join(self.dir, "img", "wide.png"), 90, 10, "PNG")
        fx.make_image(os.path.join(self.dir, "img", "thin.png"), 10, 50, "PNG")
        tagged = [{"from": "human", "value": "<image>what"}, {"from": "gpt", "value": "a cat"}]
        return [
            ("bad_record", "{not json"),
            ("bad_record", {"conversations": [{"from": "alien", "value": "x"}]}),
            ("bad_record", {"conversations": "text"}),
            ("bad_record", {"something": 1}),
            ("image_count_mismatch", {"image": "img/a.jpg", "conversations": ok}),
            ("image_count_mismatch", {"images": ["img/a.jpg"], "conversations": [
                {"from": "human", "value": "<image><image>"}, {"from": "gpt", "value": "a cat"}]}),
            ("empty_conversation", {"conversations": []}),
            ("empty_conversation", {"conversations": [{"from": "human", "value": " "},
                                                      {"from": "gpt", "value": ""}]}),
            ("one_sided_conversation", {"conversations": [{"from": "human", "value": "what"}]}),
            ("one_sided_conversation", {"conversations": [{"from": "gpt", "value": "a cat"}]}),
            ("too_many_images", {"images": ["img/a.jpg"] * 3, "conversations": [
                {"from": "human", "value": "<image><image><image>"}, {"from": "gpt", "value": "a cat"}]}),
            ("unencodable", {"conversations": [{"from": "human", "value": "what \u20ac"},
                                               {"from": "gpt", "value": "a cat"}]}),
            ("unencodable", {"conversations": [{"from": "human", "value": "what \ufdd0"},
                                               {"from": "gpt", "value": "a cat"}]}),
            ("unencodable", '{"conversations": [{"from": "human", "value": "a \\ud800"}, '
                            '{"from": "gpt", "value": "a cat"}]}'),
            ("placeholder_in_text", {"conversations": [{"from": "human", "value": "what <|image_pad|>"},
                                                       {"from": "gpt", "value": "a cat"}]}),
            ("too_many_tokens", {"conversations": [{"from": "human", "value": "what " * 200},
                                                   {"from": "gpt", "value": "a cat"}]}),
            ("missing_image", {"image": "img/nowhere.jpg", "conversations": tagged}),
            ("missing_image", {"image": "https://example.invalid/a.jpg", "conversations": tagged}),
            ("bad_image", {"image": "img/corrupt.jpg", "conversations": tagged}),
            ("bad_image", {"image": "img/anim.gif", "conversations": tagged}),
            ("image_too_large", {"image": "img/wide.png", "conversations": tagged}),
            ("aspect_ratio", {"image": "img/thin.png", "conversations": tagged}),
            ("too_large", {"images": ["img/a.jpg", "img/a.jpg"], "conversations": [
                {"from": "human", "value": "<image><image>what"}, {"from": "gpt", "value": "a cat"}]}),
            ("too_large", {"id": "x" * 300, "conversations": ok}),
            ("template_error", {"conversations": [{"from": "human", "value": "what"},
                                                  {"from": "gpt", "value": "no system"}]}),
        ]

    LIMITS = dict(max_tokens=150, max_images=2, max_sample_bytes=1200, max_meta_bytes=200,
                  images=ImageLimits(max_side=80, max_aspect_ratio=4))
    # A template that refuses "no system" answers, to count template errors.
    TEMPLATE = ("{% for m in messages %}{% if 'no system' in m['content'] %}"
                "{{ raise_exception('refused') }}{% endif %}{{ m['content'] }}\n{% endfor %}")

    def template(self):
        path = os.path.join(self.dir, "refusing.jinja")
        with open(path, "w") as f:
            f.write(self.TEMPLATE)
        return path

    def test_every_reason_is_counted_and_named_and_the_good_records_stay(self):
        bad = self.bad_records()
        self.assertEqual({r for r, _ in bad}, set(REASONS))
        good = {"id": "good", "image": "img/a.jpg", "conversations": [
            {"from": "human", "value": "<image>what"}, {"from": "gpt", "value": "a cat"}]}
        records = [good] + [r for _, r in bad] + [good]
        report, manifest, samples = self.convert(records, limits=Limits(**self.LIMITS),
                                                 chat_template=self.template())
        expected = {}
        for reason, _ in bad:
            expected[reason] = expected.get(reason, 0) + 1
        self.assertEqual(report.total.skipped, expected, json.dumps(report.total.examples, indent=1))
        self.assertEqual(report.total.samples, 2)
        self.assertEqual(sorted(samples), ["000000000", f"{len(records) - 1:09d}"])
        self.assertEqual(manifest["samples"], 2)
        # Named: the input line and what was wrong, per reason in record order.
        path_of = report.total.examples["missing_image"][0]
        self.assertRegex(path_of, r"in\.jsonl:\d+: .*nowhere\.jpg: no such file")
        self.assertRegex(report.total.examples["unencodable"][0], r"no token for '\\u20ac'|'€'")
        for reason, n in expected.items():
            self.assertEqual(len(report.total.examples[reason]), n)

    def test_strict_stops_at_the_first_bad_record_naming_it(self):
        good = {"conversations": [{"from": "human", "value": "what"}, {"from": "gpt", "value": "a cat"}]}
        for reason, record in self.bad_records():
            with self.subTest(reason=reason):
                with self.assertRaises(ConvertError) as e:
                    self.convert([good, record], limits=Limits(**self.LIMITS), strict=True,
                                 chat_template=self.template())
                self.assertIn(f"[{reason}]", str(e.exception))
                self.assertIn("in.jsonl:2", str(e.exception))
                self.assertIn("--strict", str(e.exception))


if __name__ == "__main__":
    unittest.main()
