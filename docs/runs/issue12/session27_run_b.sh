#!/bin/bash
# Session 27, device call B (issue 12): bench/speed with llm.c (built here from .llmc) on this build.
[ -d dist/bin ] || python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack/all.txz')).extractall('.')"
export LD_LIBRARY_PATH=$PWD/dist/lib
timeout 560 python3 bench/speed --bin dist/bin --llmc .llmc --steps 10 --out $OUT/speed > $OUT/speed_stdout.txt 2>&1
echo "speed rc=$?" >> $OUT/speed_stdout.txt
tail -40 $OUT/speed_stdout.txt
