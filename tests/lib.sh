# lib.sh: helpers shared by the end-to-end scripts (sourced, not run).

# The test images (CIFAR-10 and ImageNet JPEGs): VISC_SHARED_DATA where set
# (a GPU machine, to which tools/gpu/device_check.sh's data travels), else
# the shared data folder beside the checkout (CI), else the workspace's.
shared=${VISC_SHARED_DATA:-../shared/data}
[ -d "$shared" ] || shared=/work/shared/data

# cifar_subset DIR NTRAIN NTEST: an ImageNet-layout folder DIR/train,
# DIR/test with the first NTRAIN / NTEST JPEGs of each CIFAR-10 class.
cifar_subset() {
    local dir=$1 ntrain=$2 ntest=$3 split n d c files
    for split in train test; do
        n=$([ "$split" = train ] && echo "$ntrain" || echo "$ntest")
        for d in "$shared/cifar10/$split"/*/; do
            c=$(basename "$d")
            mkdir -p "$dir/$split/$c"
            files=("$d"*.jpg)
            cp "${files[@]:0:n}" "$dir/$split/$c/"
        done
    done
}

# tensors FILE: a checkpoint's header (tensor names, shapes, offsets; the
# trainer state) without the config text, which names the device, and a
# hash of its data: what two runs on different devices must share.
tensors() {
    python3 - "$1" <<'PY'
import hashlib, json, struct, sys
data = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', data[:8])[0]
head = json.loads(data[8:8 + n])
head.get('__metadata__', {}).pop('visc_config', None)
print(json.dumps(head, sort_keys=True))
print(hashlib.sha256(data[8 + n:]).hexdigest())
PY
}

# "${MPI[@]}" CMD...: CMD as 2 ranks on this machine. Under AddressSanitizer
# (tools/ci/asan.sh) the MPI runs go without leak detection: Open MPI's
# components are dlclose'd at MPI_Finalize, so the few allocations they
# keep cannot even be named by LeakSanitizer.
MPI=(env "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
     mpirun --allow-run-as-root --oversubscribe -np 2)

# rank1_of PATTERN: the pid of rank 1 of the job whose command line has PATTERN
rank1_of() {
    local p
    for p in $(pgrep -f "$1"); do
        grep -qz '^OMPI_COMM_WORLD_RANK=1$' "/proc/$p/environ" 2>/dev/null && { echo "$p"; return 0; }
    done
    return 1
}
