#!/usr/bin/env bash
# Let a tox environment import the host interpreter's packages (its CUDA torch above all) and pin
# that torch so pip can never replace it. Used by `tox -e gpu`.
#
# Why not just system_site_packages: when the host's python3 is itself a virtualenv (as on the
# GPU hosts, /opt/torch/.venv), tox's env is built from the *base* interpreter and "system site
# packages" means the base's, which has no torch. A .pth file naming the host's site-packages
# directories fixes that; they come after the env's own site-packages in sys.path.
#
# Usage: link-host-site.sh ENV_BIN_DIR ENV_SITE_PACKAGES_DIR CONSTRAINTS_FILE
# The host interpreter is $ZERO3_HOST_PYTHON, else the first python3 on PATH outside ENV_BIN_DIR.
set -Eeuo pipefail

(($# == 3)) || {
    echo "usage: $0 ENV_BIN_DIR ENV_SITE_PACKAGES_DIR CONSTRAINTS_FILE" >&2
    exit 2
}
env_bin=$1 site_dir=$2 constraints=$3

host=${ZERO3_HOST_PYTHON:-}
if [[ -z $host ]]; then
    IFS=: read -r -a dirs <<<"$PATH"
    for d in "${dirs[@]}"; do
        [[ -n $d && $d != "$env_bin" && -x $d/python3 ]] || continue
        host=$d/python3
        break
    done
fi
[[ -n $host ]] || {
    echo "link-host-site: no host python3 found on PATH; set ZERO3_HOST_PYTHON" >&2
    exit 2
}

if ! version=$("$host" -c 'import torch; print(torch.__version__)' 2>/dev/null); then
    echo "link-host-site: $host cannot import torch; set ZERO3_HOST_PYTHON to the interpreter that has it" >&2
    exit 2
fi
# The pin must use the version pip sees in the package metadata: PyPI's CUDA wheels say 2.11.0
# there while torch.__version__ says 2.11.0+cu130, and ==2.11.0+cu130 would not match 2.11.0.
dist_version=$("$host" -c 'import importlib.metadata as m; print(m.version("torch"))')
"$host" -c 'import site; print("\n".join(site.getsitepackages()))' >"$site_dir/zero3-host-site.pth"
printf 'torch==%s\n' "$dist_version" >"$constraints"
# JIT-built extensions are only valid for the torch they were built against: keep one cache per
# torch version. tox's set_env cannot compute the version, so this .pth line (run at interpreter
# start, cheap: it does not import torch) sets it unless the caller already did.
[[ $version =~ ^[A-Za-z0-9.+_-]+$ ]] || {
    echo "link-host-site: unexpected torch version string '$version'" >&2
    exit 2
}
printf 'import os; os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.expanduser("~/.cache/torch_extensions/zero3-torch-%s"))\n' \
    "$version" >"$site_dir/zero3-torch-extensions.pth"
echo "link-host-site: using torch $version and the packages of $host"
sed 's/^/  /' "$site_dir/zero3-host-site.pth"
