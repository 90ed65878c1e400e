#!/bin/sh
# Regenerates the tables of tests/eval/RESULTS.md: `dquant eval` on both real KV sets.
#   tests/eval/make_results.sh [DQUANT [DATA_DIR]]  > tables.md
# DQUANT defaults to build/client/tool/dquant, DATA_DIR to ../shared/data.
set -e
DQ=${1:-build/client/tool/dquant}
DATA=${2:-../shared/data}
run() {
    echo
    echo '```'
    echo "\$ dquant eval $*"
    echo '```'
    echo
    "$DQ" eval --data "$DATA" "$@"
}
# the ~1.96 bits/value comparison: fixed-width INT reaches below 2.25 only with bigger channel groups
# (one scale/zero pair per stream at most: n = 256 -> int2-g256, 2.125) or with 1 bit
low_bytellama=dq196,dq196@1.96,dq226@1.96,fixed196,fixed196@1.96,int2-g256,quarot2-g256,int1,quarot1
low_tinystories=dq196,dq196@1.96,fixed196,fixed196@1.96,int2,quarot2,int1,quarot1
for ds in bytellama-19m tinystories-656k; do
    echo
    echo "## $ds"
    run --dataset $ds --codecs dq226,dq226@2.25,fixed226,fixed226@2.25,int2,quarot2,kivi2,turbo2,bf16
    if [ $ds = bytellama-19m ]; then low=$low_bytellama; else low=$low_tinystories; fi
    run --dataset $ds --codecs $low
    for ab in levels budget split alpha drift; do
        run --dataset $ds --ablation $ab
    done
done
# certified value skipping (dquant eval --value-mass): the section "Certified value skipping"
for ds in bytellama-19m bytellama-n1024; do
    run --dataset $ds --value-mass 0.9,0.99,0.999,0.9999
done
# and its end-to-end cost through the --ppl protocol (about 2 minutes per run on 2 cores)
for ds in bytellama-19m bytellama-n1024; do
    run --ppl --dataset $ds --codecs fp32,dq226
    for tau in 0.99 0.999; do
        run --ppl --dataset $ds --codecs fp32,dq226 --value-mass $tau
    done
done
