#!/usr/bin/env bash
# The long version of the file-system model test (crates/fs/tests/fs_model.rs):
# every setup (crashes, I/O errors, patches, points of history, two
# devices, a bucket) for RUNS seeded runs each instead of CI's 4 to 8,
# with names of 255 bytes in groups of hundreds of operations, I/O errors
# that latch the store, and power cuts. A failure prints
# its seed; replay it with ZLOGFS_SEED=<seed> cargo test -p zlogfs-fs --test fs_model.
#   bash bench/model-soak.sh            # 200 runs per setup
#   RUNS=1000 bash bench/model-soak.sh
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
ZLOGFS_MODEL_RUNS=${RUNS:-200} cargo test --release -p zlogfs-fs --test fs_model -- --test-threads=2
echo "model soak: ${RUNS:-200} runs per setup in $(($(date +%s) - start)) s"
