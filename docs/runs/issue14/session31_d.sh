#!/bin/bash
# Session 31 plan, call D (x4, right after C): the second GPT slice (learning rate LR, chosen from
# C's result) and the proxy probation slice side by side, each through its own keeld/keel-worker.
#   bash d.sh LR DEADLINE_S
set -u
bash slice.sh $1 $2 > /tmp/d-gpt.txt 2>&1 &
bash proxy_slice.sh $2 > /tmp/d-proxy.txt 2>&1 &
wait
tail -30 /tmp/d-gpt.txt; tail -30 /tmp/d-proxy.txt
