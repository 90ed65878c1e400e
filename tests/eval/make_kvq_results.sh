#!/bin/sh
# Regenerates the KVQuant++ section of tests/eval/RESULTS.md: the perplexity / KL protocol
# (`dquant eval --ppl`) and the claims table (`dquant eval --claims`) on the three real models,
# as JSON lines under tests/eval/results/ (each run once) rendered as markdown on stdout by
# plot_rd.py --table, then the rate-distortion plot.
#   tests/eval/make_kvq_results.sh [DQUANT [DATA_DIR]] > kvq_tables.md
# About 40 minutes of one core (bytellama-n1024 and bytellama-19m dominate).
set -e
DQ=${1:-build/client/tool/dquant}
DATA=${2:-../shared/data}
OUT=tests/eval/results
mkdir -p $OUT
BASE=fp32,bf16,dq226,dq196,fixed226,int2,quarot2,kivi2,turbo2,int3,quarot3,int4,quarot4
KVQ=lm2,lm3,lm4,ip2,ip3,ip4,lm2+lr4,lm3+lr4,ol3,ol3+d16,lm3+d16,pq32x8,pq16x8
KVQ_TS=lm2,lm3,lm4,ip2,ip3,ip4,lm2+lr4,lm3+lr4,lm3+d16
ppl() { # dataset chunks codecs tag
    echo
    echo '```'
    echo "\$ dquant eval --ppl --dataset $1 --chunks $2 --codecs $3"
    echo '```'
    echo
    "$DQ" eval --ppl --data "$DATA" --dataset "$1" --chunks "$2" --codecs "$3" --json > $OUT/ppl_$1_$4.jsonl
    /usr/bin/python3 tests/eval/plot_rd.py --table $OUT/ppl_$1_$4.jsonl
}
claims() { # dataset
    echo
    echo '```'
    echo "\$ dquant eval --claims --dataset $1"
    echo '```'
    echo
    "$DQ" eval --claims --data "$DATA" --dataset "$1" --json > $OUT/claims_$1.jsonl
    /usr/bin/python3 tests/eval/plot_rd.py --table $OUT/claims_$1.jsonl
}
echo "## bytellama-n1024"
ppl bytellama-n1024 50 $BASE base
ppl bytellama-n1024 50 $KVQ kvq
claims bytellama-n1024
echo "## bytellama-19m"
ppl bytellama-19m 16 $BASE,$KVQ all
claims bytellama-19m
echo "## tinystories-656k"
ppl tinystories-656k 2 $BASE,$KVQ_TS all
claims tinystories-656k
/usr/bin/python3 tests/eval/plot_rd.py tests/eval/rd_kl.png $OUT/ppl_*.jsonl
