#!/usr/bin/env bash
# On a machine with network access, download everything `tox -e gpu` needs on an offline GPU host
# that has Python and a CUDA torch but nothing else of ours. See --help.
set -Eeuo pipefail

PROG=build-wheelhouse.sh
SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/.." && pwd -P)

usage() {
    cat <<'EOF'
Usage: scripts/build-wheelhouse.sh [--dest DIR] [--python-version X.Y] [--platform TAG]...
                                   [--version VERSION] [--test-deps] [--bench-upstream VERSION]
                                   [--qlora-trl]

Downloads into DIR (default: ./wheelhouse of this repository) wheels built for the target
interpreter and platform (default: CPython 3.12, manylinux x86_64), never for this machine:
  - DeepSpeed's runtime requirements except torch: einops hjson msgpack ninja numpy packaging
    psutil py-cpuinfo pydantic (+ pydantic-core annotated-types typing-inspection ...) tqdm, and
    nvidia-ml-py (DeepSpeed's setup.py adds it when it sees a CUDA torch)
  - tox and its requirements, setuptools and wheel (DeepSpeed is built --no-build-isolation)
  - hypothesis and its requirements: `tox -e gpu` runs the bounded lifecycle fuzz, and a GPU
    host that has pytest and the Hugging Face stack rarely has hypothesis
  - the DeepSpeed sdist of VERSION (default: the first entry of scripts/pinned-bases.tsv),
    checked against its pinned sha256; scripts/apply.sh finds it through PIP_FIND_LINKS; for a
    VERSION whose series changes upstream's tests (v0.19.2, v0.19.8), the pinned snapshot of upstream's
    tests/ too (from ZERO3_UPSTREAM_TESTS or ../shared/upstream-tests), found the same way
  - with --bench-upstream VERSION (e.g. 0.19.8): that DeepSpeed sdist too, for the benchmark's
    upstream variant (unpack it and set ZERO3_BENCH_UPSTREAM_TREE; not checked against a pin)
  - with --test-deps: pytest, transformers, peft, accelerate and their requirements, minus
    torch (for hosts that lack them; peft and accelerate are fetched without their
    dependencies, which would otherwise drag in a CUDA torch of several GB)
  - with --qlora-trl: a self-contained set in DIR/qlora-trl/ for scripts/gpu-qlora-trl.sh (the
    real-QLoRA and TRL GPU tests): bitsandbytes, trl, datasets (+ dill, multiprocess), hjson and
    pydantic (+ pydantic-core, annotated-types, typing-inspection), the DeepSpeed sdist and
    TRL's sdist (for integrations/trl's patch). bitsandbytes alone is about 43 MB, so this set
    travels to a GPU host on its own, not with the rest of DIR; see scripts/gpu-qlora-trl.sh
torch itself is never downloaded: the GPU host's own build is used.

On the GPU host (no network):
  python3 -m pip install --no-index --find-links wheelhouse tox
  PIP_NO_INDEX=1 PIP_FIND_LINKS=$PWD/wheelhouse tox -e gpu

--platform may be repeated; the default is the manylinux family for x86_64
(manylinux_2_28 down to manylinux1). For aarch64 pass e.g. --platform manylinux_2_28_aarch64
--platform manylinux2014_aarch64.
EOF
}

die() {
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit 2
}

DEST=$REPO_ROOT/wheelhouse PYVER=3.12 VERSION='' TEST_DEPS=0 BENCH_UPSTREAM='' QLORA_TRL=0
PLATFORMS=()
while (($#)); do
    case $1 in
        -h | --help)
            usage
            exit 0
            ;;
        --test-deps) TEST_DEPS=1 ;;
        --qlora-trl) QLORA_TRL=1 ;;
        --dest | --python-version | --platform | --version | --bench-upstream)
            if (($# < 2)) || [[ -z $2 ]]; then die "option $1 needs a value"; fi
            case $1 in
                --dest) DEST=$2 ;;
                --python-version) PYVER=$2 ;;
                --platform) PLATFORMS+=("$2") ;;
                --version) VERSION=$2 ;;
                --bench-upstream) BENCH_UPSTREAM=$2 ;;
            esac
            shift
            ;;
        *) die "unexpected argument '$1' (see --help)" ;;
    esac
    shift
done

[[ -z $BENCH_UPSTREAM || $BENCH_UPSTREAM =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] ||
    die "--bench-upstream wants a release number like 0.19.8; got '$BENCH_UPSTREAM'"
[[ $PYVER =~ ^3\.[0-9]+$ ]] || die "--python-version wants X.Y, e.g. 3.12; got '$PYVER'"
for p in "${PLATFORMS[@]}"; do
    [[ $p =~ ^[A-Za-z0-9_]+$ ]] || die "malformed --platform '$p'"
done
if ((${#PLATFORMS[@]} == 0)); then
    # pip does not widen an explicit manylinux tag to older ones, and many wheels only carry an
    # older tag (ninja: manylinux_2_17; psutil: manylinux_2_12): list the whole family.
    PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64
        manylinux_2_12_x86_64 manylinux2010_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64)
fi
PINNED=$SCRIPT_DIR/pinned-bases.tsv
if [[ -z $VERSION ]]; then
    VERSION=$(awk -F'\t' '$1 !~ /^#/ && NF >= 4 {print $1; exit}' "$PINNED")
fi
read -r sdist_name sdist_sha tests_name tests_sha < <(awk -F'\t' -v v="$VERSION" '$1 == v {print $3, $4, $5, $6}' "$PINNED") ||
    die "unknown version '$VERSION': not in $PINNED"

py=${PYTHON:-python3}
abi=cp${PYVER/./}
target=(--only-binary :all: --python-version "$PYVER" --implementation cp --abi "$abi" --abi abi3 --abi none)
for p in "${PLATFORMS[@]}"; do target+=(--platform "$p"); done
mkdir -p -- "$DEST"

pip_dl() { "$py" -m pip download --disable-pip-version-check --dest "$DEST" "$@"; }

# As DeepSpeed's requirements/requirements.txt, minus torch; setup.py adds nvidia-ml-py on CUDA hosts.
runtime=(einops hjson msgpack ninja numpy 'packaging>=20.0' psutil py-cpuinfo 'pydantic>=2.0.0' tqdm nvidia-ml-py)
tools=(tox setuptools wheel hypothesis)
echo "== DeepSpeed runtime requirements (without torch), tox, setuptools, wheel, hypothesis"
pip_dl "${target[@]}" "${runtime[@]}" "${tools[@]}"

if ((TEST_DEPS)); then
    echo "== test requirements (without torch)"
    # transformers does not require torch; peft and accelerate do, so their own requirements
    # other than torch are listed here and they are fetched with --no-deps.
    pip_dl "${target[@]}" pytest transformers pyyaml safetensors huggingface_hub
    pip_dl "${target[@]}" --no-deps peft accelerate
fi

echo "== DeepSpeed sdist $sdist_name"
if [[ ! -f $DEST/$sdist_name ]]; then
    pip_dl --no-deps --no-binary :all: "deepspeed==${VERSION#v}"
fi
found=$(sha256sum -- "$DEST/$sdist_name" | cut -d' ' -f1)
if [[ $found != "$sdist_sha" ]]; then
    rm -f -- "$DEST/$sdist_name"
    die "sha256 of the downloaded $sdist_name is $found, expected $sdist_sha (removed it)"
fi

if [[ -n ${tests_name:-} ]]; then
    # apply.sh commits this snapshot of upstream's tests/ on the sdist; it finds it here offline
    echo "== upstream's tests/ snapshot $tests_name"
    src=${ZERO3_UPSTREAM_TESTS:-$REPO_ROOT/../shared/upstream-tests}
    [[ -d $src ]] && src=$src/$tests_name
    [[ -f $src ]] || die "$VERSION needs $tests_name (upstream's tests/): set ZERO3_UPSTREAM_TESTS to it or its directory"
    [[ $(sha256sum -- "$src" | cut -d' ' -f1) == "$tests_sha" ]] || die "sha256 of $src is not the pinned $tests_sha"
    cp -- "$src" "$DEST/"
fi

if [[ -n $BENCH_UPSTREAM ]]; then
    echo "== DeepSpeed sdist $BENCH_UPSTREAM, for the benchmark's upstream variant"
    pip_dl --no-deps --no-binary :all: "deepspeed==$BENCH_UPSTREAM"
fi

if ((QLORA_TRL)); then
    qdir=$DEST/qlora-trl
    echo "== scripts/gpu-qlora-trl.sh's set, in $qdir"
    mkdir -p -- "$qdir"
    # --no-deps throughout: bitsandbytes, trl and datasets require torch, accelerate, pyarrow or
    # pandas, which the GPU host has (their own copies would be hundreds of MB). The versions are
    # pinned to what was tested: datasets 4.7.0 is the oldest TRL 1.16.0 takes, with the loosest
    # bounds on the host's huggingface-hub, fsspec and pyarrow; dill and multiprocess as it needs.
    # bitsandbytes 0.50.2's only Linux wheel is tagged manylinux_2_24, which the default list skips
    arch=$(sed -E 's/^manylinux(1|2010|2014|_[0-9]+_[0-9]+)_//' <<<"${PLATFORMS[0]}")
    "$py" -m pip download --disable-pip-version-check --dest "$qdir" "${target[@]}" --no-deps \
        --platform "manylinux_2_24_$arch" bitsandbytes==0.50.2 trl==1.16.0 datasets==4.7.0 dill==0.4.0 \
        multiprocess==0.70.18 hjson
    # pydantic pins its pydantic-core exactly: resolved, not listed
    "$py" -m pip download --disable-pip-version-check --dest "$qdir" "${target[@]}" 'pydantic>=2.0.0'
    cp -- "$DEST/$sdist_name" "$qdir/"
    "$py" -m pip download --disable-pip-version-check --dest "$qdir" --no-deps --no-binary :all: trl==1.16.0
    echo "== $(find "$qdir" -maxdepth 1 -type f | wc -l) files in $qdir ($(du -sh -- "$qdir" | cut -f1))"
fi

# nvidia_ml_py is NVML's Python binding (pure Python, 50 kB), not a CUDA library.
if find "$DEST" -maxdepth 1 \( -name 'torch-*' -o -name 'nvidia_*' -o -name 'triton-*' \) ! -name 'nvidia_ml_py-*' |
    grep -q .; then
    die "a torch/CUDA wheel ended up in $DEST; remove it: the GPU host must use its own torch"
fi
echo "== $(find "$DEST" -maxdepth 1 -type f | wc -l) files in $DEST ($(du -sh -- "$DEST" | cut -f1))"
