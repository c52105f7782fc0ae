# usage: ab.sh ROUNDS script args... : alternates main and wt-cpu
R=$1; shift
for i in $(seq $R); do for tree in /work/main /work/wt-cpu; do
  cd $tree && OMP_NUM_THREADS=${THREADS:-2} PYTHONPATH=$tree ${PYTHON:-/work/main/.venv/bin/python} "$@" 2>/dev/null | grep RESULT
done; done
