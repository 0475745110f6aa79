#!/bin/bash
# usage: cifail.sh NAME EXCLUDE...   -- a clean clone's .ci/run with a PATH that lacks the named programs
name=$1; shift
bin=${TMPDIR:-/tmp}/pathfilter-$name; rm -rf $bin; mkdir -p $bin
for d in /usr/local/sbin /usr/local/bin /usr/sbin /usr/bin; do
  for f in $d/*; do b=$(basename $f); skip=0
    for x in "$@"; do [ "$b" = "$x" ] && skip=1; done
    [ $skip = 0 ] && [ ! -e $bin/$b ] && ln -s $f $bin/$b
  done
done
rm -rf /tmp/ci-$name && git clone -q "${REPO:-.}" /tmp/ci-$name
cd /tmp/ci-$name
start=$(date +%s)
env PATH=$bin bash .ci/run > ${LOG:-/tmp/ci-$name.log} 2>&1; rc=$?
echo "rc=$rc elapsed=$(( $(date +%s) - start ))s commit=$(git rev-parse --short HEAD) PATH without: $*" >> ${LOG:-/tmp/ci-$name.log}
