#!/usr/bin/env bash
# The install and run steps of the tox environments, quiet and timed: each prints one line saying
# what it did and how long it took; pip's own output goes to a log that is shown when pip fails.
#
#   tox-step.sh deps REQUIREMENT...     install the test requirements into the current Python
#   tox-step.sh deepspeed TREE          pip install a patched DeepSpeed tree (--no-build-isolation)
#   tox-step.sh upstream-compat TREE [POSARGS...]
#                                       run the tree's upstream-style tests, unless POSARGS (the
#                                       test paths given to `tox -e ENV -- ...`) are given
#
# deps: a requirement torch==VERSION is installed first and on its own, as PyPI's CPU-only build
# from ZERO3_TORCH_INDEX (default https://download.pytorch.org/whl/cpu, the "+cpu" builds; "none"
# turns it off). The index is probed first (ZERO3_TORCH_INDEX_TIMEOUT seconds, default 10): when it
# cannot be reached, torch comes from pip's configured sources (PyPI alone has only the CUDA build
# there, several GB) and a warning says so. The other requirements are then installed with torch
# pinned, so that none of them can replace it. With PIP_NO_INDEX set, no index is probed.
# deps and deepspeed skip their work when a stamp in the environment says it is already done.
set -Eeuo pipefail

PROG=tox-step.sh
PY=${PYTHON:-python}

die() {
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit 2
}

say() { printf '%s: %s\n' "$PROG" "$*"; }

PREFIX=$("$PY" -c 'import sys; print(sys.prefix)')
LOG=  # pip's output of the current step: $PREFIX/zero3-pip-STEP.log

# quiet_pip ARGS...: pip with its output appended to $LOG; on failure the log's tail is shown.
quiet_pip() {
    printf '== pip install %s\n' "$*" >>"$LOG"
    if ! "$PY" -m pip install --disable-pip-version-check "$@" >>"$LOG" 2>&1; then
        printf '%s: pip install %s failed; the last lines of %s:\n' "$PROG" "$*" "$LOG" >&2
        tail -n 25 -- "$LOG" | sed 's/^/  /' >&2
        exit 1
    fi
}

dist_version() {
    "$PY" -c 'import importlib.metadata as m, sys
try:
    print(m.version(sys.argv[1]))
except m.PackageNotFoundError:
    pass' "$1"
}

# The torch index answers (HTTP) within the timeout: "ok", else why not.
probe_index() {
    "$PY" - "$1" "${ZERO3_TORCH_INDEX_TIMEOUT:-10}" <<'EOF'
import sys
import urllib.request

url, timeout = sys.argv[1].rstrip("/") + "/torch/", float(sys.argv[2])
try:
    urllib.request.urlopen(url, timeout=timeout).close()
    print("ok")
except Exception as e:  # any failure means: do not send pip there
    print(f"{type(e).__name__}: {getattr(e, 'reason', e)}")
EOF
}

install_torch() {
    local version=$1 have index why
    have=$(dist_version torch)
    if [[ ${have%%+*} == "$version" ]]; then
        say "torch $have already installed"
        return
    fi
    index=${ZERO3_TORCH_INDEX-https://download.pytorch.org/whl/cpu}
    if [[ -n ${PIP_NO_INDEX:-} && ${PIP_NO_INDEX,,} != @(0|false|no|off) ]]; then
        say "PIP_NO_INDEX is set: torch==$version from PIP_FIND_LINKS / pip's configured links"
        quiet_pip "torch==$version"
    elif [[ -z $index || $index == none ]]; then
        say "ZERO3_TORCH_INDEX=none: torch==$version from pip's configured sources"
        quiet_pip "torch==$version"
    elif why=$(probe_index "$index") && [[ $why == ok ]]; then
        say "torch==$version: the CPU build from $index (about 190 MB)"
        # An extra index: pip picks the highest version, and VERSION+cpu sorts above PyPI's VERSION.
        quiet_pip --extra-index-url "$index" "torch==$version"
    else
        {
            printf '%s: warning: torch index %s not reachable within %s s (%s); ' \
                "$PROG" "$index" "${ZERO3_TORCH_INDEX_TIMEOUT:-10}" "$why"
            printf "installing torch==%s from pip's configured sources. From PyPI that is the CUDA build " "$version"
            printf 'with its nvidia-* packages (several GB): set ZERO3_TORCH_INDEX to a reachable mirror of '
            printf 'the CPU index, or put a torch-%s+cpu wheel into PIP_FIND_LINKS\n' "$version"
        } >&2
        quiet_pip "torch==$version"
    fi
    say "torch $(dist_version torch) installed"
}

step_deps() {
    (($#)) || die "deps needs at least one requirement"
    local stamp=$PREFIX/zero3-deps.txt want torch="" rest=() r constraint have
    want=$(printf '%s\n' "ZERO3_TORCH_INDEX=${ZERO3_TORCH_INDEX-default}" "$@")
    if [[ -f $stamp && $(<"$stamp") == "$want" ]]; then
        say "deps: already installed ($*)"
        return
    fi
    for r in "$@"; do
        if [[ $r == torch==* ]]; then torch=${r#torch==}; else rest+=("$r"); fi
    done
    [[ -z $torch ]] || install_torch "$torch"
    if ((${#rest[@]})); then
        constraint=$PREFIX/zero3-torch-pin.txt
        have=$(dist_version torch)
        # Pinning what is installed keeps pip from swapping torch for another build while it
        # resolves peft and accelerate (which require torch).
        if [[ -n $have ]]; then printf 'torch==%s\n' "$have" >"$constraint"; else : >"$constraint"; fi
        quiet_pip -c "$constraint" "${rest[@]}"
        say "installed ${rest[*]} (pip log: $LOG)"
    fi
    printf '%s\n' "$want" >"$stamp"
}

# What identifies the tree's content: its commit, plus any change to tracked files. Taken after
# the install, since pip rewrites tracked files of an sdist tree (deepspeed.egg-info/,
# deepspeed/git_version_info_installed.py): an untouched tree then matches its stamp.
tree_state() {
    local tree=$1
    printf 'tree=%s\nhead=%s\ndiff=%s\n' "$tree" "$(git -C "$tree" rev-parse HEAD)" \
        "$(git -C "$tree" diff HEAD -- . | cksum)"
}

step_deepspeed() {
    (($# == 1)) || die "usage: $PROG deepspeed TREE"
    local tree stamp state
    tree=$(cd -- "$1" && pwd -P) || die "no DeepSpeed tree at $1"
    stamp=$PREFIX/zero3-deepspeed.txt
    state=$(tree_state "$tree")
    if [[ -f $stamp && $(<"$stamp") == "$state" && -n $(dist_version deepspeed) ]]; then
        say "deepspeed $(dist_version deepspeed) from $tree at $(git -C "$tree" rev-parse --short HEAD)" \
            "already installed"
        return
    fi
    rm -f -- "$stamp"
    quiet_pip --no-build-isolation "$tree"
    tree_state "$tree" >"$stamp"
    say "installed deepspeed $(dist_version deepspeed) from $tree at" \
        "$(git -C "$tree" rev-parse --short HEAD) (pip log: $LOG)"
}

step_upstream_compat() {
    (($# >= 1)) || die "usage: $PROG upstream-compat TREE [POSARGS...]"
    local tree=$1
    shift
    if (($#)); then
        say "test paths given ($*): the upstream-style tests of $tree are not run"
        return
    fi
    "$PY" -m tests.upstream_compat.run "$tree" -q
}

(($#)) || die "usage: $PROG deps REQUIREMENT... | deepspeed TREE | upstream-compat TREE [POSARGS...]"
step=$1
shift
[[ $step == @(deps|deepspeed|upstream-compat) ]] || die "unknown step '$step' (deps, deepspeed, upstream-compat)"
start=$SECONDS
LOG=$PREFIX/zero3-pip-$step.log
[[ $step == upstream-compat ]] || : >"$LOG"
"step_${step//-/_}" "$@"
say "$step: done in $((SECONDS - start)) s"
