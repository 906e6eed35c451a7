"""train — `tessera train`'s loop (the C ts_train_run: AdamW, warmup and
cosine, clipping, accumulation, mixed precision, checkpoints in Hugging
Face's layout, MFU) from Python, with a callback after every step; and
prepare_data, which tokenizes text files into the shards it reads.
"""

import ctypes as C
import math
import os

from . import _lib
from ._lib import Error, lib as L


class StepInfo(C.Structure):
    _fields_ = [("step", C.c_int64), ("steps", C.c_int64), ("loss", C.c_double),
                ("lr", C.c_double), ("grad_norm", C.c_double), ("tokens_per_s", C.c_double),
                ("mfu", C.c_double), ("step_s", C.c_double), ("val_loss", C.c_double)]


_ON_STEP = C.CFUNCTYPE(C.c_bool, C.c_void_p, C.POINTER(StepInfo))


class _TrainOptions(C.Structure):
    """ts_train_options (tessera_train.h), field for field."""
    _fields_ = [("model_config", C.c_char_p), ("init_from", C.c_char_p), ("data_dir", C.c_char_p),
                ("out_dir", C.c_char_p), ("tokenizer_dir", C.c_char_p),
                ("batch", C.c_int64), ("seq", C.c_int64), ("grad_accum", C.c_int64),
                ("steps", C.c_int64), ("lr", C.c_double), ("min_lr", C.c_double),
                ("warmup", C.c_int64), ("constant_lr", C.c_bool), ("weight_decay", C.c_double),
                ("clip", C.c_double), ("beta1", C.c_double), ("beta2", C.c_double),
                ("eval_every", C.c_int64), ("eval_batches", C.c_int64), ("save_every", C.c_int64),
                ("log_every", C.c_int64), ("keep_last", C.c_int64), ("seed", C.c_uint64),
                ("device", C.c_char_p), ("eager", C.c_bool), ("checkpoint_activations", C.c_bool),
                ("bf16", C.c_bool), ("resume", C.c_bool), ("quiet", C.c_bool), ("peak", C.c_double),
                ("dist", C.c_void_p), ("shard", C.c_int), ("no_overlap", C.c_bool),
                ("bucket_mb", C.c_double), ("on_step", _ON_STEP), ("on_step_arg", C.c_void_p)]


class _TrainResult(C.Structure):
    _fields_ = [("steps_done", C.c_int64), ("first_loss", C.c_double), ("last_loss", C.c_double),
                ("last_val_loss", C.c_double), ("tokens_per_s", C.c_double), ("mfu", C.c_double),
                ("seconds", C.c_double), ("timed_from", C.c_int64), ("timed_steps", C.c_int64),
                ("peak", C.c_double), ("peak_sgemm", C.c_double), ("comm_share", C.c_double),
                ("n_params", C.c_int64)]


class _PrepareOptions(C.Structure):
    _fields_ = [("tokenizer_dir", C.c_char_p), ("out_dir", C.c_char_p),
                ("val_fraction", C.c_double), ("shard_tokens", C.c_int64), ("quiet", C.c_bool),
                ("model_config", C.c_char_p)]


class _PrepareResult(C.Structure):
    _fields_ = [("bytes", C.c_int64), ("train_tokens", C.c_int64), ("val_tokens", C.c_int64),
                ("train_shards", C.c_int), ("val_shards", C.c_int)]


L.ts_train_default_options.restype = _TrainOptions
L.ts_train_default_options.argtypes = []
L.ts_train_run.restype = C.c_int
L.ts_train_run.argtypes = [C.c_void_p, C.POINTER(_TrainOptions), C.POINTER(_TrainResult)]
L.ts_prepare_data.restype = C.c_int
L.ts_prepare_data.argtypes = [C.c_void_p, C.POINTER(C.c_char_p), C.c_int,
                              C.POINTER(_PrepareOptions), C.POINTER(_PrepareResult)]

# the CLI's flag names (dashes as underscores) that differ from the struct's
_ALIASES = {"config": "model_config", "data": "data_dir", "out": "out_dir",
            "tokenizer": "tokenizer_dir", "weight_decay": "weight_decay", "schedule": None,
            "dtype": None}
_STR = {"model_config", "init_from", "data_dir", "out_dir", "tokenizer_dir", "device"}


def _fields():
    return {name: typ for name, typ in _TrainOptions._fields_
            if name not in ("dist", "on_step", "on_step_arg", "shard", "no_overlap", "bucket_mb")}


def train(config, callback=None):
    """Trains as `tessera train` does. config: a dict of its options by the
    struct's or the CLI's names (model_config or init_from, data_dir,
    out_dir, batch, seq, steps, lr, min_lr, warmup, schedule
    "cosine"|"constant", weight_decay, clip, beta1, beta2, grad_accum,
    eval_every, eval_batches, save_every, log_every, keep_last, seed,
    device, eager, checkpoint_activations, dtype "float32"|"bfloat16",
    resume, quiet, peak (FLOP/s) or peak_gflops). callback(info) after
    every step with a dict {step, steps, loss, lr, grad_norm, tokens_per_s,
    mfu, step_s, val_loss}; returning True ends the run there (its checkpoint written).
    Returns the run's figures as a dict."""
    if not isinstance(config, dict):
        raise Error(f"train: config is a dict of options, not {type(config).__name__}")
    o = L.ts_train_default_options()
    fields = _fields()
    keep = []
    for k, v in config.items():
        name = _ALIASES.get(k, k)
        if k == "schedule":
            if v not in ("cosine", "constant"):
                raise Error(f"train: schedule {v!r}: cosine or constant")
            o.constant_lr = v == "constant"
            continue
        if k == "compile":
            o.eager = not bool(v)
            continue
        if k == "peak_gflops":  # the CLI's --peak-gflops
            o.peak = float(v) * 1e9
            continue
        if k == "dtype":
            if v not in ("float32", "f32", "bfloat16", "bf16"):
                raise Error(f"train: dtype {v!r}: float32 or bfloat16")
            o.bf16 = v in ("bfloat16", "bf16")
            continue
        if name not in fields:
            raise Error(f"train: unknown option {k!r} (options: {', '.join(sorted(fields))}, "
                        "schedule, dtype, compile, peak_gflops)")
        try:
            if name in _STR:
                keep.append(os.fspath(v).encode())
                v = keep[-1]
            elif fields[name] is C.c_bool:
                v = bool(v)
            elif fields[name] is C.c_double:
                v = float(v)
            elif isinstance(v, float) and not v.is_integer():
                raise ValueError(v)
            else:
                v = int(v)
            setattr(o, name, v)
        except (TypeError, ValueError, OverflowError):
            want = ("a path" if name in _STR else "a number" if fields[name] is C.c_double
                    else "an integer")
            raise Error(f"train: {k} {v!r}: want {want}") from None
    raised = []

    def on_step(arg, p):
        if callback is None:
            return False
        i = p.contents
        info = {name: getattr(i, name) for name, _ in StepInfo._fields_}
        if math.isnan(info["val_loss"]):
            info["val_loss"] = None
        try:
            return bool(callback(info))
        except BaseException as e:  # stop the run, raise it after
            raised.append(e)
            return True

    cb = _ON_STEP(on_step)
    o.on_step = cb
    res = _TrainResult()
    st = L.ts_train_run(_lib.ctx(), C.byref(o), C.byref(res))
    if raised:
        raise raised[0]
    _lib.check(st)
    return {name: getattr(res, name) for name, _ in _TrainResult._fields_}


def prepare_data(files, tokenizer_dir, out_dir, val_fraction=0.05, shard_tokens=1 << 26,
                 model_config=None, quiet=True):
    """Tokenizes text files into out_dir's train/val shards, as `tessera
    prepare-data` does; returns the counts."""
    if isinstance(files, (str, bytes, os.PathLike)):
        files = [files]
    files = [os.fsencode(f) for f in files]
    arr = (C.c_char_p * len(files))(*files)
    mc = os.fspath(model_config).encode() if model_config else None
    o = _PrepareOptions(os.fspath(tokenizer_dir).encode(), os.fspath(out_dir).encode(),
                        float(val_fraction), int(shard_tokens), bool(quiet), mc)
    r = _PrepareResult()
    _lib.check(L.ts_prepare_data(_lib.ctx(), arr, len(files), C.byref(o), C.byref(r)))
    return {name: getattr(r, name) for name, _ in _PrepareResult._fields_}
