"""serve — the OpenAI-compatible server (the C ts_server_run, as `tessera
serve` runs it) started in-process on a background thread: tessera.serve
returns once it listens, with the port it bound; Server.stop() ends it as
SIGTERM would (running requests finish). One server per process at a
time; Python's own signal handlers are left alone.
"""

import ctypes as C
import os
import threading

from . import _lib
from ._lib import Error, lib as L


class _EngineOptions(C.Structure):
    _fields_ = [("block_size", C.c_int64), ("n_blocks", C.c_int64), ("kv_memory", C.c_int64),
                ("max_seqs", C.c_int), ("max_batch_tokens", C.c_int64),
                ("no_prefix_cache", C.c_bool), ("kv_dtype", C.c_int), ("enforce_eager", C.c_bool),
                ("spec", C.c_int), ("spec_tokens", C.c_int), ("spec_ngram_min", C.c_int),
                ("spec_ngram_max", C.c_int), ("spec_draft", C.c_void_p)]


_ON_LISTEN = C.CFUNCTYPE(None, C.c_int, C.c_void_p)


class _ServerOptions(C.Structure):
    """ts_server_options (tessera_server.h), field for field."""
    _fields_ = [("model_dir", C.c_char_p), ("model_name", C.c_char_p), ("host", C.c_char_p),
                ("port", C.c_int), ("weight_dtype", C.c_int), ("no_check_weights", C.c_bool),
                ("device_map", C.c_char_p), ("engine", _EngineOptions), ("kv_port", C.c_int),
                ("no_kv_events", C.c_bool), ("kv_peers", C.c_char_p), ("kv_senders", C.c_char_p),
                ("api_key", C.c_char_p), ("chat_template", C.c_char_p),
                ("allowed_origins", C.c_char_p), ("pooling", C.c_int),
                ("max_model_len", C.c_int64), ("no_log_requests", C.c_bool),
                ("max_connections", C.c_int), ("max_connections_per_client", C.c_int),
                ("conn_timeout_s", C.c_int), ("on_listen", _ON_LISTEN), ("on_listen_arg", C.c_void_p),
                ("no_signal_handlers", C.c_bool), ("draft_model_dir", C.c_char_p)]


L.ts_engine_options_default.restype = _EngineOptions
L.ts_engine_options_default.argtypes = []
L.ts_server_run.restype = C.c_int
L.ts_server_run.argtypes = [C.POINTER(_ServerOptions)]
L.ts_server_stop.restype = None
L.ts_server_stop.argtypes = []
L.ts_server_last_error.restype = C.c_char_p
L.ts_server_last_error.argtypes = []
L.ts_model_dir_check.restype = C.c_int
L.ts_model_dir_check.argtypes = [C.c_void_p, C.c_char_p, C.c_uint]

_running = threading.Lock()  # one server per process

# keyword -> (field, converter); the engine's under "engine."
_OPTIONS = {
    "model_name": ("model_name", "str"), "api_key": ("api_key", "str"),
    "chat_template": ("chat_template", "str"), "allowed_origins": ("allowed_origins", "str"),
    "device_map": ("device_map", "str"), "max_model_len": ("max_model_len", "int"),
    "max_num_seqs": ("engine.max_seqs", "int"), "max_seqs": ("engine.max_seqs", "int"),
    "num_kv_blocks": ("engine.n_blocks", "int"), "kv_memory": ("engine.kv_memory", "int"),
    "block_size": ("engine.block_size", "int"),
    "max_batch_tokens": ("engine.max_batch_tokens", "int"),
    "no_prefix_cache": ("engine.no_prefix_cache", "bool"),
    "enforce_eager": ("engine.enforce_eager", "bool"),
    "no_log_requests": ("no_log_requests", "bool"), "check_weights": ("no_check_weights", "notbool"),
    "kv_port": ("kv_port", "int"), "kv_peers": ("kv_peers", "str"), "kv_senders": ("kv_senders", "str"),
    "no_kv_events": ("no_kv_events", "bool"), "max_connections": ("max_connections", "int"),
    "conn_timeout_s": ("conn_timeout_s", "int"),
    "speculative": ("engine.spec", "spec"),
    "num_speculative_tokens": ("engine.spec_tokens", "spec_tokens"),
    "prompt_lookup_min": ("engine.spec_ngram_min", "lookup"),
    "prompt_lookup_max": ("engine.spec_ngram_max", "lookup"),
    "draft_model": ("draft_model_dir", "path"),
}

# speculative= (ts_spec_method); None: off. The kinds _spec_value checks.
_SPEC_METHODS = {None: 0, "none": 0, "ngram": 1, "draft": 2}
_SPEC_KINDS = ("spec", "spec_tokens", "lookup", "path")


def _spec_value(k, kind, v, keep):
    """A speculative-decoding keyword's value as its C field wants it (a
    path kept alive in keep); a bad one raises tessera.Error naming k."""
    if kind == "path":
        keep.append(os.fspath(v).encode())
        return keep[-1]
    if kind == "spec":
        if v not in _SPEC_METHODS:
            raise Error(f"serve: speculative={v!r}: 'ngram' or 'draft' (or None)", "INVALID_ARG")
        return _SPEC_METHODS[v]
    lo, hi = (1, 16) if kind == "spec_tokens" else (1, 64)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise Error(f"serve: {k}={v!r}: want a whole number in {lo}..{hi}", "RANGE")
    return v


class Server:
    """A running server: .port, .url, .stop(); a context manager."""

    def __init__(self, opts, keep):
        self._opts, self._keep = opts, keep  # the option strings must outlive the run
        self._listening = threading.Event()
        self.port = None
        self.returncode = None

        def on_listen(port, arg):
            self.port = port
            self._listening.set()

        self._cb = _ON_LISTEN(on_listen)
        opts.on_listen = self._cb
        self._thread = threading.Thread(target=self._run, name="tessera-serve", daemon=True)

    def _run(self):
        try:
            self.returncode = L.ts_server_run(C.byref(self._opts))
        finally:
            self._listening.set()
            _running.release()

    @property
    def url(self):
        host = self._opts.host.decode()
        return f"http://{host}:{self.port}"

    @property
    def running(self):
        return self._thread.is_alive()

    def stop(self, timeout=None):
        """Stops taking requests, lets the running ones finish, and waits
        for the server to end (timeout seconds at most; None: no limit)."""
        if self._thread.is_alive():
            L.ts_server_stop()
            self._thread.join(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def __repr__(self):
        state = "running" if self.running else "stopped"
        return f"tessera.Server({self.url}, {state})"


_KV_DTYPES = {"bf16": 0, "f32": 1, "int8": 2}  # ts_kv_dtype (tessera_models.h)


def serve(model_dir, host="127.0.0.1", port=0, dtype="float32", kv_dtype="bf16", **options):
    """Starts `tessera serve` on model_dir in this process and returns a
    Server once it listens (port 0, the default: any free port, Server.port
    says which). A startup failure (the folder, the port in use, a bad
    option) raises tessera.Error with the server's reason. kv_dtype is the
    KV cache's type: "bf16" (the default), "f32" or "int8" (`--kv-dtype`).
    options are the CLI's flags by their Python names: model_name, api_key,
    chat_template, allowed_origins, device_map, max_model_len, max_num_seqs,
    num_kv_blocks, kv_memory, block_size, max_batch_tokens, no_prefix_cache,
    no_log_requests, check_weights, kv_port, kv_peers, kv_senders,
    no_kv_events, max_connections, conn_timeout_s; speculative decoding:
    speculative ("ngram": prompt lookup, "draft": a draft model),
    num_speculative_tokens (1..16, default 4), prompt_lookup_min and
    prompt_lookup_max (n-gram lengths, 1..64; default 1 and 4; one given
    alone sets both),
    draft_model (a folder or GGUF file with the model's vocabulary;
    implies speculative="draft")."""
    model_dir = os.fspath(model_dir)
    c = _lib.ctx()
    _lib.check(L.ts_model_dir_check(c, model_dir.encode(), 7))
    if dtype not in ("float32", "bfloat16"):
        raise Error(f"serve: dtype {dtype!r}: float32 or bfloat16", "DTYPE")
    if kv_dtype not in _KV_DTYPES:
        raise Error(f"serve: kv_dtype {kv_dtype!r}: bf16, f32 or int8", "RANGE")
    if not 0 <= int(port) <= 65535:
        raise Error(f"serve: port {port} is out of range (0-65535)", "RANGE")
    o = _ServerOptions()
    keep = [model_dir.encode(), host.encode()]
    o.model_dir, o.host, o.port = keep[0], keep[1], int(port)
    o.weight_dtype = 1 if dtype == "bfloat16" else 0
    o.engine = L.ts_engine_options_default()
    o.engine.kv_dtype = _KV_DTYPES[kv_dtype]
    o.kv_port, o.pooling, o.no_signal_handlers = -1, 1, True
    env_key = os.environ.get("TESSERA_API_KEY")
    if env_key:
        keep.append(env_key.encode())
        o.api_key = keep[-1]
    for k, v in options.items():
        if k not in _OPTIONS:
            raise Error(f"serve: unknown option {k!r} (options: {', '.join(sorted(_OPTIONS))})")
        field, kind = _OPTIONS[k]
        if kind in _SPEC_KINDS:
            v = _spec_value(k, kind, v, keep)
        elif kind == "str":
            keep.append(str(v).encode())
            v = keep[-1]
        elif kind == "int":
            v = int(v)
        elif kind == "bool":
            v = bool(v)
        else:
            v = not bool(v)
        target = o
        if field.startswith("engine."):
            target, field = o.engine, field[7:]
        setattr(target, field, v)
    if not _running.acquire(blocking=False):
        raise Error("serve: a server already runs in this process (stop it first)", "STATE")
    srv = Server(o, keep)
    try:
        srv._thread.start()
        srv._listening.wait()
    except BaseException:  # Ctrl-C while the model loads: it ends once listening
        if srv._thread.ident is None:
            _running.release()
        while srv._thread.is_alive():
            L.ts_server_stop()  # again, in case the thread had not begun the run
            srv._thread.join(0.1)
        raise
    if srv.port is None:
        srv._thread.join()
        why = (L.ts_server_last_error() or b"").decode("utf-8", "replace")
        raise Error(f"serve: {why or 'the server did not start'}", "STATE")
    return srv
