#!/usr/bin/env bash
# scripts/prepare-corpus --tokenize-only on a real keel-train, with the byte tokenizer (one token
# per byte, so the counts and the contents of the shards are checkable here):
#  - train parts + val text go through one prepare-text whose cut lands exactly at the start of
#    the val text: the val shard holds the val bytes and nothing else, the train shard the parts'
#    bytes in order;
#  - a folder without the parts is refused, naming it; and so is a keel-train that is not there.
set -euo pipefail
script="$PWD/scripts/prepare-corpus"
train="$PWD/worker/engine/keel-train"
work="${TEST_TMPDIR:-/tmp}/prepare_corpus_tokenize"
rm -rf "$work" && mkdir -p "$work/corpus"
cd "$work"
printf 'First train document.\n\nIts second paragraph.\n\n\n' > part0
printf 'Second part: one document, and some more text.\n\n\n' > part1
printf 'The validation document.\n\nWith two paragraphs.\n\n\n' > val
xz -c part0 > corpus/train.00.txt.xz
xz -c part1 > corpus/train.01.txt.xz
xz -c val > corpus/val.txt.xz
/usr/bin/python3 "$script" --tokenize-only corpus --keel-train "$train" --tokenizer bytes \
    --min-train-tokens 1 > out.txt
cat part0 part1 > train_text
/usr/bin/python3 - <<'PY'
import struct
def shard(path):
    data = open(path, "rb").read()
    header = struct.unpack("<256i", data[:1024])
    assert header[:2] == (20240520, 1), header[:3]
    tokens = struct.unpack("<%dH" % header[2], data[1024:])
    assert len(data) == 1024 + 2 * header[2]
    return bytes(tokens)
assert shard("corpus/corpus_train.bin") == open("train_text", "rb").read(), "train shard"
assert shard("corpus/corpus_val.bin") == open("val", "rb").read(), "val shard"
PY
grep -q "^train 96 tokens, val 49 tokens" out.txt || { cat out.txt; echo "unexpected summary"; exit 1; }

mkdir empty
if /usr/bin/python3 "$script" --tokenize-only empty --keel-train "$train" 2> err.txt; then
  echo "a folder without parts was accepted"; exit 1
fi
grep -q "empty has no train.NN.txt.xz parts and val.txt.xz" err.txt || { cat err.txt; exit 1; }
if /usr/bin/python3 "$script" --tokenize-only corpus --keel-train "$work/nothing" 2> err.txt; then
  echo "a missing keel-train was accepted"; exit 1
fi
grep -q "keel-train is '$work/nothing', not an executable" err.txt || { cat err.txt; exit 1; }
echo "1 passed, 0 failed"
