"""test_py_models.py TESSERA_BIN MODEL_DIR — tessera.load / generate /
logits / apply_chat_template / serve / train / prepare_data from Python,
each against what the CLI or the server gives for the same input:

- generate (greedy, seeded sampling, chat template, stop strings,
  streamed or whole, twice with the KV cache's prefix reused) prints the
  bytes `tessera run` prints;
- logits equal `tessera logits`'s .npy bit for bit, batched rows equal
  single ones, and their argmax is generate's first greedy token;
- the chat template renders as the server's /v1/chat/completions sees it
  (the reply of a greedy chat request equals generate(messages=...));
- serve starts in-process on a free port, answers /health and a
  completion equal to generate's, stops, and starts again; a bad folder
  raises tessera.Error;
- train runs `tessera train`'s loop with a per-step callback whose losses
  are the ones log.jsonl records, stops early when the callback says so,
  and refuses an unknown option by name.
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import unittest
import urllib.request

import numpy as np

import tessera

BIN, MODEL = sys.argv[1], sys.argv[2]
del sys.argv[1:3]


def cli_run_in(model, *args):
    r = subprocess.run([BIN, "run", "-m", model, *args], capture_output=True, text=True, check=True)
    assert r.stdout.endswith("\n"), r.stdout
    return r.stdout[:-1]  # run ends the reply with a newline


def cli_run(*args):
    return cli_run_in(MODEL, *args)


class TestGenerate(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.m = tessera.load(MODEL)

    def test_greedy_equals_run(self):
        self.assertEqual(self.m.generate("And God said", max_tokens=32),
                         cli_run("-p", "And God said", "-n", "32"))

    def test_sampled_equals_run(self):
        for seed in (1, 7):
            got = self.m.generate("In the beginning", max_tokens=40, temperature=0.9, top_k=50,
                                  top_p=0.95, seed=seed)
            want = cli_run("-p", "In the beginning", "-n", "40", "--temperature", "0.9",
                           "--top-k", "50", "--top-p", "0.95", "--seed", str(seed))
            self.assertEqual(got, want)

    def test_chat_equals_run(self):
        self.assertEqual(self.m.generate("Who was Moses?", max_tokens=24, chat=True),
                         cli_run("-p", "Who was Moses?", "-n", "24", "--chat"))
        self.assertEqual(
            self.m.generate("Who was Moses?", max_tokens=24, chat=True, system="Answer briefly."),
            cli_run("-p", "Who was Moses?", "-n", "24", "--system", "Answer briefly."))

    def test_stop_strings_equal_run(self):
        got = self.m.generate("And God said", max_tokens=48, stop=["house", "\n"])
        self.assertEqual(got, cli_run("-p", "And God said", "-n", "48", "--stop", "house",
                                      "--stop", "\n"))
        self.assertNotIn("house", got)

    def test_stream_joins_to_the_whole(self):
        pieces = list(self.m.generate("And the LORD", max_tokens=30, temperature=0.7, seed=3,
                                      stream=True))
        self.assertGreater(len(pieces), 5)
        self.assertEqual("".join(pieces), self.m.generate("And the LORD", max_tokens=30,
                                                          temperature=0.7, seed=3))

    def test_prefix_reuse_changes_nothing(self):
        a = self.m.generate("And God said unto Moses", max_tokens=16)
        b = self.m.generate("And God said unto Moses", max_tokens=16)  # cache reused
        self.m.generate("Jesus wept", max_tokens=4)  # another prompt in between
        c = self.m.generate("And God said unto Moses", max_tokens=16)
        self.assertEqual(a, b)
        self.assertEqual(a, c)

    def test_streams_and_the_kv_cache(self):
        m = tessera.load(MODEL)
        want = m.generate("And God said unto Moses", max_tokens=16)
        # a stream left open, then another prompt, then the stream dropped:
        # the cache's bookkeeping stays the later call's (it was the
        # dropped stream's, so the next call reused a prefix it lacked)
        g = m.generate("And God said unto Moses", max_tokens=16, stream=True)
        next(g)
        m.generate("Jesus wept", max_tokens=8)
        del g
        self.assertEqual(m.generate("And God said unto Moses", max_tokens=16), want)
        # an older stream resumed after a newer generation raises; the
        # newer one is unaffected
        a = m.generate("And God said", max_tokens=10, stream=True)
        b = m.generate("Jesus wept", max_tokens=10, stream=True)
        first_a, first_b = next(a), next(b)
        with self.assertRaises(tessera.Error) as e:
            next(a)
        self.assertIn("took its KV cache", str(e.exception))
        self.assertEqual(first_b + "".join(b), m.generate("Jesus wept", max_tokens=10))
        self.assertTrue(m.generate("And God said", max_tokens=10).startswith(first_a))
        # closed under an open stream, and the tokenizer after close
        s = m.generate("And God said", max_tokens=10, stream=True)
        next(s)
        tok = m.tokenizer
        m.close()
        with self.assertRaises(tessera.Error) as e:
            next(s)
        self.assertIn("closed", str(e.exception))
        with self.assertRaises(tessera.Error):
            tok.encode("And God said")
        with self.assertRaises(tessera.Error):
            m.generate("And God said")

    def test_end_token_after_held_back_text(self):
        # "," made an end token (generation_config.json): the text held
        # back while it might start a stop string is still returned when an
        # end token ends the reply, by generate and by `tessera run --stop`
        with tempfile.TemporaryDirectory() as d:
            for f in os.listdir(MODEL):
                if f != "generation_config.json":
                    os.symlink(os.path.abspath(os.path.join(MODEL, f)), os.path.join(d, f))
            comma = self.m.tokenizer.encode(",", add_special_tokens=False)[0]
            with open(os.path.join(d, "generation_config.json"), "w") as f:
                json.dump({"eos_token_id": [self.m.eos[0], comma]}, f)
            m = tessera.load(d)
            plain = m.generate("In the beginning God created", max_tokens=40)
            self.assertTrue(0 < len(plain) < len(self.m.generate("In the beginning God created",
                                                                 max_tokens=40)))
            self.assertNotIn(",", plain)
            self.assertEqual(m.generate("In the beginning God created", max_tokens=40,
                                        stop="zzzzzzzzzz"), plain)
            self.assertEqual("".join(m.generate("In the beginning God created", max_tokens=40,
                                                stop="zzzzzzzzzz", stream=True)), plain)
            r = subprocess.run([BIN, "run", "-m", d, "-p", "In the beginning God created", "-n",
                                "40", "--stop", "zzzzzzzzzz"], capture_output=True, text=True,
                               check=True)
            self.assertEqual(r.stdout[:-1], plain)

    def test_device_map(self):
        want = self.m.generate("And God said", max_tokens=24)
        split = tessera.load(MODEL, device_map="embed,0-3:cpu:0;4-7,head:cpu:1")
        self.assertEqual(split.generate("And God said", max_tokens=24), want)
        self.assertEqual(split.generate("And God said", max_tokens=24),
                         cli_run("-p", "And God said", "-n", "24", "--device-map",
                                 "embed,0-3:cpu:0;4-7,head:cpu:1"))
        if "vulkan:0" in tessera.devices():
            gpu = tessera.load(MODEL, device_map="vulkan:0")
            self.assertEqual(gpu.generate("And God said", max_tokens=24),
                             cli_run("-p", "And God said", "-n", "24", "--device", "vulkan:0"))
        with self.assertRaises(tessera.Error) as e:
            tessera.load(MODEL, device_map="embed,0-1:cpu:0;2-3,head:cpu:1")
        self.assertIn("layer 4 is not placed", str(e.exception))

    def test_bad_input(self):
        with self.assertRaises(tessera.Error):
            self.m.generate("x", temperature=-1)
        with self.assertRaises(tessera.Error):
            self.m.generate("x", max_tokens=-2)
        with self.assertRaises(tessera.Error) as e:
            self.m.generate("x", stop=[1])
        self.assertIn("stop", str(e.exception))
        with self.assertRaises(tessera.Error) as e:  # raised by the call, not the first next()
            self.m.generate("word " * 5000, stream=True)
        self.assertIn("does not fit the context", str(e.exception))
        with self.assertRaises(tessera.Error) as e:
            tessera.load("/nonexistent/model")
        self.assertIn("/nonexistent/model", str(e.exception))
        with self.assertRaises(tessera.Error) as e:
            tessera.load("missing.gguf")  # a GGUF path goes to the C loader
        self.assertIn("missing.gguf: no such folder", str(e.exception))
        level, best = tessera.cpu_isa()
        order = ["sse2", "avx2", "avx512", "avx512_bf16", "amx"]
        self.assertLessEqual(order.index(level), order.index(best))


class TestLogits(unittest.TestCase):
    def test_logits_equal_cli(self):
        m = tessera.load(MODEL)
        ids = m.tokenizer.encode("And God said, Let there be light")
        got = m.logits(ids).numpy()
        self.assertEqual(got.shape, (1, len(ids), m.vocab_size))
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "l.npy")
            subprocess.run([BIN, "logits", "-m", MODEL, "--ids", ",".join(map(str, ids)),
                            "--out", out], check=True, capture_output=True)
            want = np.load(out)
        np.testing.assert_array_equal(got[0], want)
        both = m.logits([ids, ids]).numpy()
        np.testing.assert_allclose(both[1], got[0], rtol=0, atol=1e-4)  # another GEMM blocking
        first = m.generate("And God said, Let there be light", max_tokens=1)
        self.assertEqual(m.tokenizer.decode([int(got[0, -1].argmax())]), first)

    def test_tokenizer_round_trip(self):
        m = tessera.load(MODEL)
        text = "In the beginning God created the heaven and the earth."
        self.assertEqual(m.tokenizer.decode(m.tokenizer.encode(text, add_special_tokens=False)), text)


class TestServe(unittest.TestCase):
    def post(self, srv, path, body):
        req = urllib.request.Request(srv.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.load(r)

    def test_serve_in_process(self):
        m = tessera.load(MODEL)
        want = m.generate("And God said", max_tokens=16)
        chat_want = m.generate(messages=[{"role": "user", "content": "Who was Moses?"}],
                               max_tokens=12)
        with tessera.serve(MODEL, port=0, no_log_requests=True) as srv:
            self.assertTrue(srv.running and srv.port > 0)
            with urllib.request.urlopen(srv.url + "/health", timeout=30) as r:
                self.assertEqual(r.status, 200)
            r = self.post(srv, "/v1/completions", {"prompt": "And God said", "max_tokens": 16,
                                                   "temperature": 0})
            self.assertEqual(r["choices"][0]["text"], want)
            r = self.post(srv, "/v1/chat/completions",
                          {"messages": [{"role": "user", "content": "Who was Moses?"}],
                           "max_tokens": 12, "temperature": 0})
            self.assertEqual(r["choices"][0]["message"]["content"], chat_want)
            with self.assertRaises(tessera.Error):  # one server per process
                tessera.serve(MODEL, port=0)
        self.assertFalse(srv.running)
        again = tessera.serve(MODEL, port=0, no_log_requests=True)  # a second run works
        self.assertTrue(again.running)
        again.stop()
        self.assertFalse(again.running)

    def test_bad_options(self):
        with self.assertRaises(tessera.Error):
            tessera.serve("/nonexistent/model", port=0)
        with socket.socket() as busy:  # the server's own reason, not a hang
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            with self.assertRaises(tessera.Error) as e:
                tessera.serve(MODEL, port=busy.getsockname()[1])
            self.assertIn("cannot listen on 127.0.0.1:%d (Address already in use)"
                          % busy.getsockname()[1], str(e.exception))
        with self.assertRaises(tessera.Error) as e:
            tessera.serve(MODEL, host="localhost")
        self.assertIn('bad --host "localhost"', str(e.exception))
        with self.assertRaises(tessera.Error) as e:
            tessera.serve(MODEL, port=0, not_an_option=1)
        self.assertIn("not_an_option", str(e.exception))
        with self.assertRaises(tessera.Error):
            tessera.serve(MODEL, port=70000)


class TestTrain(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        d = self.d = self.tmp.name
        with open(os.path.join(d, "a.txt"), "w") as f:
            for i in range(300):
                f.write(f"In the beginning God created the heaven and the earth, day {i}.\n")
        self.data = os.path.join(d, "data")
        r = tessera.prepare_data([os.path.join(d, "a.txt")], MODEL, self.data)
        self.assertGreater(r["train_tokens"], 1000)
        with open(os.path.join(MODEL, "config.json")) as f:
            cfg = json.load(f)
        cfg.update(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=2, num_key_value_heads=1, head_dim=16)
        self.cfg = os.path.join(d, "config.json")
        with open(self.cfg, "w") as f:
            json.dump(cfg, f)

    def tearDown(self):
        self.tmp.cleanup()

    def test_callback_sees_the_logged_steps(self):
        steps = []
        out = os.path.join(self.d, "out")
        res = tessera.train({"model_config": self.cfg, "data_dir": self.data, "out_dir": out,
                             "batch": 4, "seq": 16, "steps": 12, "warmup": 2, "lr": 3e-3,
                             "quiet": True, "peak": 1e11}, callback=steps.append)
        self.assertEqual(res["steps_done"], 12)
        self.assertEqual([s["step"] for s in steps], list(range(1, 13)))
        with open(os.path.join(out, "log.jsonl")) as f:
            logged = [json.loads(line) for line in f]
        self.assertEqual([round(s["loss"], 6) for s in steps], [e["loss"] for e in logged])
        self.assertTrue(all(s["tokens_per_s"] > 0 and 0 < s["mfu"] < 1 for s in steps))
        self.assertLess(steps[-1]["loss"], steps[0]["loss"])
        self.assertAlmostEqual(res["last_loss"], steps[-1]["loss"])
        # the result is a model folder tessera.load reads
        with open(os.path.join(out, "latest")) as f:
            final = os.path.join(out, f.read().strip())
        with tessera.load(final) as m:
            self.assertEqual(m.config["num_hidden_layers"], 2)
            self.assertEqual(m.generate("In the beginning", max_tokens=6),
                             cli_run_in(final, "-p", "In the beginning", "-n", "6"))

    def test_callback_stops_the_run(self):
        out = os.path.join(self.d, "out2")
        res = tessera.train({"model_config": self.cfg, "data_dir": self.data, "out_dir": out,
                             "batch": 2, "seq": 16, "steps": 100, "quiet": True,
                             "peak_gflops": 50}, callback=lambda s: s["step"] >= 3)
        self.assertEqual(res["steps_done"], 3)
        self.assertEqual(res["peak"], 50e9)
        self.assertTrue(os.path.isdir(os.path.join(out, "step_000003")))

    def test_callback_error_propagates(self):
        def boom(s):
            raise ValueError("from the callback")

        with self.assertRaises(ValueError):
            tessera.train({"model_config": self.cfg, "data_dir": self.data,
                           "out_dir": os.path.join(self.d, "out3"), "batch": 2, "seq": 16,
                           "steps": 50, "quiet": True}, callback=boom)

    def test_bad_options(self):
        with self.assertRaises(tessera.Error) as e:
            tessera.train({"model_config": self.cfg, "bogus": 1})
        self.assertIn("bogus", str(e.exception))
        with self.assertRaises(tessera.Error) as e:
            tessera.train({"model_config": self.cfg, "batch": "four"})
        self.assertIn("batch 'four'", str(e.exception))
        with self.assertRaises(tessera.Error):
            tessera.train([("model_config", self.cfg)])
        with self.assertRaises(tessera.Error):
            tessera.train({"model_config": self.cfg, "data_dir": "/nonexistent",
                           "out_dir": os.path.join(self.d, "o")})


if __name__ == "__main__":
    unittest.main(verbosity=2)
