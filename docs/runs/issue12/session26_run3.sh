#!/bin/bash
# Session 26, device run 3 (H100): bench/speed at the session's last engine build, with llm.c built from .llmc.
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack/all.txz')).extractall('.')" 2>/dev/null
export LD_LIBRARY_PATH=$PWD/dist/lib
timeout 560 python3 bench/speed --bin dist/bin --llmc .llmc --steps 10 --out /tmp/speed > $OUT/speed_stdout.txt 2>&1
echo "speed rc=$?" >> $OUT/speed_stdout.txt
cp /tmp/speed/results.json $OUT/ 2>/dev/null; cp /tmp/speed/commands.txt $OUT/speed_commands.txt 2>/dev/null
ls /tmp/speed > $OUT/speed_files.txt 2>&1
