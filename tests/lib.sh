# lib.sh: helpers shared by the end-to-end scripts (sourced, not run).

# The shared data folder beside the checkout (CI), else the workspace's.
shared=../shared/data
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
