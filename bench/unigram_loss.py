#!/usr/bin/python3
"""unigram_loss.py — the baseline a language model must beat.

    /usr/bin/python3 bench/unigram_loss.py DATA_DIR

Reads prepare-data's shards (train_*.bin, val_*.bin: the 32-byte TSTK
header, then 2- or 4-byte ids) and prints the cross-entropy, in nats per
token, of the validation tokens under a unigram model of the training
tokens (add-one smoothing over the vocabulary of meta.json): the loss of a
model that knows each token's frequency and nothing of context. Standard
library only."""
import glob
import json
import math
import os
import struct
import sys
from array import array
from collections import Counter


def tokens(path):
    with open(path, "rb") as f:
        head = f.read(32)
        magic, version, width, _, count, _ = struct.unpack("<IIIIQQ", head)
        if magic != 0x4B545354 or version != 1 or width not in (2, 4):
            sys.exit(f"unigram_loss: {path} is not a TSTK v1 shard")
        a = array("H" if width == 2 else "I")
        a.frombytes(f.read(count * width))
        if sys.byteorder != "little":
            a.byteswap()
        return a


d = sys.argv[1] if len(sys.argv) > 1 else sys.exit(__doc__)
vocab = json.load(open(os.path.join(d, "meta.json")))["vocab_size"]
train = Counter()
for p in sorted(glob.glob(os.path.join(d, "train_*.bin"))):
    train.update(tokens(p))
n_train = sum(train.values())
val = Counter()
for p in sorted(glob.glob(os.path.join(d, "val_*.bin"))):
    val.update(tokens(p))
n_val = sum(val.values())
if not n_train or not n_val:
    sys.exit("unigram_loss: no train or no validation tokens")
ce = -sum(c * math.log((train[t] + 1) / (n_train + vocab))
          for t, c in val.items()) / n_val
ent = -sum(c / n_train * math.log(c / n_train) for c in train.values())
print(f"{n_train} train, {n_val} validation tokens, vocabulary {vocab}")
print(f"unigram entropy of the train tokens: {ent:.4f} nats/token")
print(f"validation cross-entropy under the train unigram: {ce:.4f} "
      f"nats/token (perplexity {math.exp(ce):.1f})")
