"""models — Hugging Face model folders from Python: tessera.load gives a
Model over the C ts_lm (any supported family, with a device_map), its
tokenizer and chat template; Model.generate is `tessera run`'s loop
(src/cli/run.c: generation_config.json's defaults, the same sampler, end
tokens, stop strings, the streaming detokenizer and the KV cache's prefix
reused from one call to the next), so the same prompt and seed give the
same text; Model.logits is the forward pass.
"""

import codecs
import ctypes as C
import json
import os
import threading

from . import _lib
from ._lib import Error, lib as L
from .tensor import _wrap

TS_MODEL_ALL = 7


class _LoadOptions(C.Structure):
    _fields_ = [("weight_dtype", C.c_int), ("device_map", C.c_char_p),
                ("no_check_weights", C.c_bool), ("warn", C.c_void_p), ("warn_user", C.c_void_p)]


class _Sampling(C.Structure):
    _fields_ = [("temperature", C.c_double), ("top_k", C.c_int64), ("top_p", C.c_double),
                ("min_p", C.c_double), ("repetition_penalty", C.c_double), ("seed", C.c_uint64),
                ("presence_penalty", C.c_double), ("frequency_penalty", C.c_double)]


class _Detok(C.Structure):
    _fields_ = [("pending", C.c_ubyte * 8), ("n_pending", C.c_int), ("started", C.c_bool),
                ("n_stripped", C.c_int)]


class _ConfigHead(C.Structure):
    """The leading fields of ts_model_config (tessera_io.h), the ones read here."""
    _fields_ = [("arch", C.c_int), ("model_type", C.c_char * 32), ("vocab", C.c_int64),
                ("hidden", C.c_int64), ("layers", C.c_int64), ("heads", C.c_int64),
                ("kv_heads", C.c_int64), ("head_dim", C.c_int64), ("intermediate", C.c_int64),
                ("max_positions", C.c_int64)]


_vp, _pp = C.c_void_p, C.POINTER(C.c_void_p)
_P_I32 = C.POINTER(C.c_int32)
for _name, _r, _a in (
        ("ts_model_dir_check", C.c_int, [_vp, C.c_char_p, C.c_uint]),
        ("ts_lm_load", C.c_int, [_vp, C.c_char_p, C.POINTER(_LoadOptions), _pp]),
        ("ts_lm_free", None, [_vp]),
        ("ts_lm_config", C.POINTER(_ConfigHead), [_vp]),
        ("ts_lm_cache_new", C.c_int, [_vp, C.c_int64, _pp]),
        ("ts_lm_cache_free", None, [_vp]),
        ("ts_lm_cache_truncate", None, [_vp, C.c_int64]),
        ("ts_lm_forward_cached", _vp, [_vp, _vp, _vp, C.c_bool]),
        ("ts_lm_forward", _vp, [_vp, _vp]),
        ("ts_tokenizer_load", C.c_int, [_vp, C.c_char_p, _pp]),
        ("ts_tokenizer_free", None, [_vp]),
        ("ts_tokenizer_check_vocab", C.c_int, [_vp, _vp, C.c_int64]),
        ("ts_tokenizer_token_id", C.c_int32, [_vp, C.c_char_p]),
        ("ts_tokenizer_vocab_size", C.c_int32, [_vp]),
        ("ts_tokenizer_encode_text", C.c_int, [_vp, C.c_char_p, C.c_size_t, C.c_bool,
                                                C.POINTER(_P_I32), C.POINTER(C.c_size_t)]),
        ("ts_tokenizer_decode", C.c_int, [_vp, _P_I32, C.c_size_t, C.c_bool, _pp,
                                          C.POINTER(C.c_size_t)]),
        ("ts_tokenizer_decode_step", C.c_int, [_vp, C.POINTER(_Detok), C.c_int32, C.c_char_p,
                                               C.c_size_t, C.POINTER(C.c_size_t)]),
        ("ts_chat_load", C.c_int, [_vp, C.c_char_p, _pp]),
        ("ts_chat_load_with", C.c_int, [_vp, C.c_char_p, C.c_char_p, _pp]),
        ("ts_chat_free", None, [_vp]),
        ("ts_chat_eos_token", C.c_char_p, [_vp]),
        ("ts_chat_apply", C.c_int, [_vp, C.c_char_p, C.c_bool, C.c_char_p, _pp,
                                    C.POINTER(C.c_size_t)]),
        ("ts_sampling_default", _Sampling, []),
        ("ts_sampling_check", C.c_int, [_vp, C.POINTER(_Sampling)]),
        ("ts_sampler_new", C.c_int, [_vp, C.POINTER(_Sampling), _pp]),
        ("ts_sampler_free", None, [_vp]),
        ("ts_sampler_next", C.c_int32, [_vp, C.POINTER(C.c_float), C.c_int64, _P_I32, C.c_size_t]),
):
    _f = getattr(L, _name)
    _f.restype, _f.argtypes = _r, _a

_DTYPES = {"float32": 0, "f32": 0, "bfloat16": 1, "bf16": 1}


class _no_grad:
    """Gradients off (and eager or compiled mode) on the context for one
    generation step, restored after it: a paused stream leaves the
    context as the caller set it."""

    def __init__(self, c, compiled):
        self.c, self.compiled = c, compiled

    def __enter__(self):
        self.grad = L.ts_set_grad_enabled(self.c, False)
        self.mode = L.ts_set_mode(self.c, 1 if self.compiled else 0)

    def __exit__(self, *exc):
        L.ts_set_mode(self.c, self.mode)
        L.ts_set_grad_enabled(self.c, self.grad)
_MAX_EOS = 8


def _take_string(p, n):
    """A malloc'd C string as bytes, freed."""
    try:
        return C.string_at(p, n)
    finally:
        _lib.free(p)


class Tokenizer:
    """The model's tokenizer.json (byte-level BPE and the rest the runtime
    reads), as Hugging Face's tokenizer encodes and decodes."""

    def __init__(self, handle):
        self._h = handle  # None once its model is closed

    def _handle(self):
        if not self._h:
            raise Error("the tokenizer's model is closed", "STATE")
        return self._h

    def encode(self, text, add_special_tokens=True):
        b = text.encode("utf-8")
        ids, n = _P_I32(), C.c_size_t()
        _lib.check(L.ts_tokenizer_encode_text(self._handle(), b, len(b), add_special_tokens,
                                              C.byref(ids), C.byref(n)))
        try:
            return ids[:n.value]
        finally:
            _lib.free(C.cast(ids, C.c_void_p))

    def decode(self, ids, skip_special_tokens=False):
        arr = (C.c_int32 * len(ids))(*ids)
        p, n = C.c_void_p(), C.c_size_t()
        _lib.check(L.ts_tokenizer_decode(self._handle(), arr, len(ids), skip_special_tokens,
                                         C.byref(p), C.byref(n)))
        return _take_string(p.value, n.value).decode("utf-8", "replace")

    def token_id(self, token):
        i = L.ts_tokenizer_token_id(self._handle(), token.encode())
        return None if i < 0 else i

    @property
    def vocab_size(self):
        return L.ts_tokenizer_vocab_size(self._handle())


def _model_json(c, path, name):
    """A model's JSON file as a dict: read from the folder, or made from a
    GGUF file's metadata (ts_model_file_text); None when absent or not
    JSON."""
    p = L.ts_model_file_text(c, path.encode(), name.encode())
    if not p:
        return None
    try:
        return json.loads(C.string_at(p).decode("utf-8"))
    except ValueError:
        return None
    finally:
        _lib.free(p)


class Model:
    """A causal LM loaded from a Hugging Face folder or a GGUF file (see
    tessera.load)."""

    def __init__(self, path, device_map=None, dtype="float32", check_weights=True,
                 chat_template=None, compiled=False, ctx_size=None):
        path = os.fspath(path)
        if dtype not in _DTYPES:
            raise Error(f"load: dtype {dtype!r}: the weights are float32 or bfloat16", "DTYPE")
        self.path = path
        self._lm = self._tok = self._chat = self._kc = None
        self.tokenizer = None
        # the KV cache's owner: the generation that ran last (an older
        # stream resumed after it raises rather than read a cache that is
        # no longer its own); the lock keeps threads out of each other's
        # steps
        self._gen, self._lock = 0, threading.Lock()
        c = _lib.ctx()
        _lib.check(L.ts_model_dir_check(c, path.encode(), TS_MODEL_ALL))
        self._dm = device_map.encode() if device_map else None
        lo = _LoadOptions(_DTYPES[dtype], self._dm, not check_weights, None, None)
        h = C.c_void_p()
        _lib.check(L.ts_lm_load(c, path.encode(), C.byref(lo), C.byref(h)))
        self._lm = h.value
        head = L.ts_lm_config(self._lm).contents
        self.vocab_size, self.max_positions = head.vocab, head.max_positions
        self.config = _model_json(c, path, "config.json") or {}
        t = C.c_void_p()
        _lib.check(L.ts_tokenizer_load(c, path.encode(), C.byref(t)))
        self.tokenizer = Tokenizer(t.value)
        self._tok = t.value
        _lib.check(L.ts_tokenizer_check_vocab(c, self._tok, self.vocab_size))
        self._chat_template = chat_template
        self.compiled = compiled
        # generation_config.json's sampling defaults and end tokens, then
        # config.json's end token (as `tessera run`)
        self.defaults, self.eos = {}, []
        g = _model_json(c, path, "generation_config.json") or {}
        if g.get("do_sample") is True:
            for k in ("temperature", "top_p", "min_p"):
                if isinstance(g.get(k), (int, float)) and not isinstance(g.get(k), bool):
                    self.defaults[k] = float(g[k])
            if isinstance(g.get("top_k"), int) and not isinstance(g.get("top_k"), bool):
                self.defaults["top_k"] = g["top_k"]
        if isinstance(g.get("repetition_penalty"), (int, float)):
            self.defaults["repetition_penalty"] = float(g["repetition_penalty"])
        e = g.get("eos_token_id")
        for v in ([e] if isinstance(e, int) else e if isinstance(e, list) else []):
            if isinstance(v, int) and not isinstance(v, bool) and len(self.eos) < _MAX_EOS:
                self.eos.append(v)
        if not self.eos:
            ce = self.config.get("eos_token_id")
            ce = ce[0] if isinstance(ce, list) and ce else ce
            if isinstance(ce, int) and ce >= 0:
                self.eos.append(ce)
        limit = ctx_size or 4096
        self.max_T = min(limit, self.max_positions)
        self._cached = []

    # ---- lifetime ----
    def close(self):
        with self._lock:  # not while another thread runs a step
            self._gen += 1  # a stream still open ends with an error
            self._cached = []
            if self.tokenizer is not None:
                self.tokenizer._h = None
            if self._kc:
                L.ts_lm_cache_free(self._kc)
            if self._chat:
                L.ts_chat_free(self._chat)
            if self._tok:
                L.ts_tokenizer_free(self._tok)
            if self._lm:
                L.ts_lm_free(self._lm)
            self._kc = self._chat = self._tok = self._lm = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"tessera.Model({self.path!r}, {self.config.get('model_type', '?')})"

    def _need(self):
        if not self._lm:
            raise Error("the model is closed", "STATE")

    # ---- chat ----
    def _chat_handle(self):
        if self._chat is None:
            h = C.c_void_p()
            c = _lib.ctx()
            if self._chat_template:
                _lib.check(L.ts_chat_load_with(c, self.path.encode(), self._chat_template.encode(),
                                               C.byref(h)))
            else:
                _lib.check(L.ts_chat_load(c, self.path.encode(), C.byref(h)))
            self._chat = h.value
        return self._chat

    def apply_chat_template(self, messages, add_generation_prompt=True, **variables):
        """The model's chat template over messages ([{"role", "content"}, ...])
        rendered as the server and `tessera run --chat` render it."""
        self._need()
        ch = self._chat_handle()
        p, n = C.c_void_p(), C.c_size_t()
        extra = json.dumps(variables).encode() if variables else None
        _lib.check(L.ts_chat_apply(ch, json.dumps(messages).encode(), add_generation_prompt, extra,
                                   C.byref(p), C.byref(n)))
        return _take_string(p.value, n.value).decode("utf-8")

    # ---- forward ----
    def logits(self, ids):
        """Logits (B, T, V) of token ids: a list (one sequence) or a list of
        equal-length lists, from position 0."""
        self._need()
        rows = ids if ids and isinstance(ids[0], (list, tuple)) else [ids]
        T = len(rows[0])
        if T == 0 or any(len(r) != T for r in rows):
            raise Error("logits: ids must be non-empty sequences of one length")
        flat = [int(i) for r in rows for i in r]
        arr = (C.c_int64 * len(flat))(*flat)
        shape = (C.c_int64 * 2)(len(rows), T)
        c = _lib.ctx()
        old = L.ts_set_grad_enabled(c, False)
        try:
            x = _wrap(L.ts_from_data(c, 4, 2, shape, arr))
            return _wrap(L.ts_lm_forward(self._lm, x._h))
        finally:
            L.ts_set_grad_enabled(c, old)

    # ---- generation ----
    def _prompt_ids(self, prompt, messages, chat, system):
        if messages is None and (chat or system is not None):
            messages = ([{"role": "system", "content": system}] if system is not None else []) + \
                [{"role": "user", "content": prompt}]
        if messages is not None:
            text = self.apply_chat_template(messages)
            return self.tokenizer.encode(text, add_special_tokens=False), True
        if prompt is None:
            raise Error("generate: give a prompt or messages")
        return self.tokenizer.encode(prompt, add_special_tokens=True), False

    def _sampling(self, temperature, top_k, top_p, min_p, repetition_penalty, seed):
        s = L.ts_sampling_default()
        for k, v in self.defaults.items():
            setattr(s, k, v)
        given = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p,
                 "repetition_penalty": repetition_penalty, "seed": seed}
        for k, v in given.items():
            if v is not None:
                setattr(s, k, v)
        _lib.check(L.ts_sampling_check(_lib.ctx(), C.byref(s)))
        return s

    def generate(self, prompt=None, max_tokens=128, temperature=None, top_k=None, top_p=None,
                 min_p=None, repetition_penalty=None, seed=None, stop=None, ignore_eos=False,
                 chat=False, system=None, messages=None, stream=False):
        """Continues prompt (or the chat template over messages; chat=True
        renders prompt as one user message) by up to max_tokens tokens.
        Sampling defaults: generation_config.json's, else greedy; seed 0.
        stream=True: an iterator of text pieces as they are decoded; else the
        whole text. Generation ends at an end token (unless ignore_eos), a
        stop string (cut before it) or max_tokens. The model has one KV
        cache: a stream resumed after a later generate() on the same model
        raises tessera.Error (drop or finish it first)."""
        self._need()
        if max_tokens < 0:
            raise Error(f"generate: max_tokens {max_tokens} < 0", "RANGE")
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if any(not isinstance(s, str) for s in stops):
            raise Error(f"generate: stop {stop!r}: a string or a list of strings")
        if len(stops) > 8 or any(not s for s in stops):
            raise Error("generate: at most 8 stop strings, none empty", "RANGE")
        ids, templated = self._prompt_ids(prompt, messages, chat, system)
        if not ids:
            raise Error("generate: the prompt is empty")
        if len(ids) + 1 > self.max_T:
            raise Error(f"generate: the prompt ({len(ids)} tokens) does not fit the context of "
                        f"{self.max_T} tokens (ctx_size)", "RANGE")
        eos = list(self.eos)
        if templated:
            eot = L.ts_chat_eos_token(self._chat_handle()).decode()
            i = self.tokenizer.token_id(eot) if eot else None
            if i is not None and len(eos) < _MAX_EOS:
                eos.append(i)
        sampling = self._sampling(temperature, top_k, top_p, min_p, repetition_penalty, seed)
        it = self._generate(ids, max_tokens, sampling, [s.encode() for s in stops], eos, ignore_eos)
        return it if stream else "".join(it)

    def _own(self, me):
        """Raises unless generation me still owns the model's KV cache."""
        if not self._lm:
            raise Error("generate: the model was closed during this stream", "STATE")
        if self._gen != me:
            raise Error("generate: a later generate() on this model took its KV cache while "
                        "this stream was open; finish (or close()) a stream before starting "
                        "another on the same model", "STATE")

    def _generate(self, ids, max_new, sampling, stops, eos, ignore_eos):
        c = _lib.ctx()
        n_prompt = len(ids)
        with self._lock:
            self._need()
            self._gen += 1
            me = self._gen
            sm = C.c_void_p()
            _lib.check(L.ts_sampler_new(c, C.byref(sampling), C.byref(sm)))
            try:
                if not self._kc:
                    kc = C.c_void_p()
                    _lib.check(L.ts_lm_cache_new(self._lm, self.max_T, C.byref(kc)))
                    self._kc = kc.value
            except BaseException:
                L.ts_sampler_free(sm)
                raise
            keep = 0  # the longest cached prefix, leaving a token to run
            while keep < len(self._cached) and keep + 1 < n_prompt and \
                    self._cached[keep] == ids[keep]:
                keep += 1
            L.ts_lm_cache_truncate(self._kc, keep)
            self._cached = []
        seq = (C.c_int32 * (n_prompt + max_new))(*ids)
        max_stop = max((len(s) for s in stops), default=0)
        text, printed, n, feed_from, generated = b"", 0, n_prompt, keep, 0
        st = _Detok()
        buf = C.create_string_buffer(64)
        piece_len = C.c_size_t()
        utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        stopped, consistent = False, True  # consistent: the cache holds seq[:n - 1]
        try:
            while generated < max_new and not stopped and n < self.max_T:
                with self._lock, _no_grad(c, self.compiled):
                    self._own(me)
                    consistent = False
                    T = n - feed_from
                    shape = (C.c_int64 * 2)(1, T)
                    chunk = (C.c_int64 * T)(*seq[feed_from:n])
                    x = _wrap(L.ts_from_data(c, 4, 2, shape, chunk))
                    logits = _wrap(L.ts_lm_forward_cached(self._lm, self._kc, x._h, True))
                    del x
                    if logits.device != "cpu:0":
                        logits = logits.to("cpu:0")
                    row = L.ts_tensor_data(logits._h)
                    if not row:
                        raise _lib.last_error()
                    V = logits.shape[2]
                    nxt = L.ts_sampler_next(sm, C.cast(row, C.POINTER(C.c_float)), V, seq, n)
                    del logits
                    feed_from = n
                    seq[n] = nxt
                    n += 1
                    generated += 1
                    consistent = True
                    if not ignore_eos and nxt in eos:
                        break
                    _lib.check(L.ts_tokenizer_decode_step(self._tok, C.byref(st), nxt, buf, 64,
                                                          C.byref(piece_len)))
                text += buf.raw[:piece_len.value]
                for s in stops:
                    hit = text.find(s, printed - max_stop if printed > max_stop else 0)
                    if hit >= 0:
                        text, stopped = text[:hit], True
                        break
                safe = len(text) if (stopped or not stops) else max(len(text) - max_stop, 0)
                if safe > printed:
                    out = utf8.decode(text[printed:safe])
                    printed = safe
                    if out:
                        yield out
            if len(text) > printed:
                out = utf8.decode(text[printed:])
                if out:
                    yield out
            rest = utf8.decode(b"", final=True)
            if rest:
                yield rest
        finally:
            L.ts_sampler_free(sm)
            if self._gen == me:
                # the cache holds seq[0 .. n-1) (the last token was not
                # run); after a failed step, nothing reusable
                self._cached = list(seq[:n - 1]) if consistent else []


def load(path, device_map=None, dtype="float32", check_weights=True, chat_template=None,
         compiled=False, ctx_size=None):
    """A Hugging Face causal-LM folder (config.json, *.safetensors,
    tokenizer.json), or a GGUF file (quantized weights kept as they are), as
    a Model. device_map: "cpu", "vulkan:0", "auto" or a
    split ("embed,0-13:cpu:0;14-27,head:vulkan:0"), as the CLI's
    --device-map; dtype: the weights in memory, "float32" or "bfloat16";
    chat_template: a file or a built-in's name instead of the model's;
    compiled: run the forward as a compiled graph; ctx_size: the context
    (prompt + reply) in tokens (default 4096, capped by the model)."""
    return Model(path, device_map=device_map, dtype=dtype, check_weights=check_weights,
                 chat_template=chat_template, compiled=compiled, ctx_size=ctx_size)
