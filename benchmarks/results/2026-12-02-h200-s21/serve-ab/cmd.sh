# One device call (nvidia-h200), /work/main at baa7ead ("before") and this branch at c3a5160
# exported to .dev-serve ("after"); 230 s of device time with the machine's start.
# carry: .whl .dev-serve
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit; cd .dev-serve && (BEFORE=$(cd .. && pwd) OUT=/tmp/ab NUM_CLIENTS="1 4" RATE10_PROMPTS=100 timeout 170 bash benchmarks/serve_ab.sh 2>&1 | tee $OUT/log.txt); tar czf $OUT/results.tgz -C /tmp/ab .; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
