#!/usr/bin/env bash
# The current stack (TFX 1.21 / TF 2.21 / Keras 3 / Beam 2.77) needs glibc >= 2.39
# (ml-metadata 1.21 and TFDV 1.21 ship manylinux_2_39 wheels only). On an older
# host this script builds a Debian 13 root once, into a cache outside the clone,
# and runs commands inside it with the repo bind-mounted at the same path.
#
#   .ci/stack-root.sh choose        print the stack `make` should use (current|1.16),
#                                   and on stderr one line saying why
#   .ci/stack-root.sh root          build the Debian 13 root if not built (root mode only)
#   .ci/stack-root.sh venv          build the venv for requirements-current.lock if needed
#   .ci/stack-root.sh venv-path     print that venv's path
#   .ci/stack-root.sh run CMD...    run CMD with the venv's bin first on PATH (in the root
#                                   where the host's glibc is too old)
#
# Environment: TFXKIT_STACK_CACHE (default ~/.cache/tfxkit), TFXKIT_GLIBC and
# TFXKIT_HOST_PYTHON_VERSION (force the host's answers, for tests),
# TFXKIT_STACK_SUITE (default trixie = Debian 13), TFXKIT_DEBOOTSTRAP (its path).
#
# Mounts: every mount is made inside `unshare --mount --propagation private`, so
# all of them disappear with the command, whichever way it exits.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd -P)
CACHE=${TFXKIT_STACK_CACHE:-$HOME/.cache/tfxkit}
ROOT=$CACHE/debian13
SUITE=${TFXKIT_STACK_SUITE:-trixie}
DEBOOTSTRAP=${TFXKIT_DEBOOTSTRAP:-debootstrap}
LOCK=$REPO/requirements-current.lock
MIN_GLIBC=2.39
# g++ and python3-dev: TFDV 1.21 pins pyfarmhash <0.4, whose 0.3.2 has no cp313
# wheel and builds from source; git: the benchmarks' code key reads the clone.
# A root built with another list is rebuilt.
PACKAGES=python3,python3-venv,python3-pip,python3-dev,g++,git,ca-certificates
# Python versions TFX 1.21's wheels cover.
PYTHONS="3.10 3.11 3.12 3.13"

die() { echo "stack-root: $*" >&2; exit 1; }

# "a.b" >= "c.d"?
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1)" = "$2" ]; }

host_glibc() {
    if [ -n "${TFXKIT_GLIBC:-}" ]; then echo "$TFXKIT_GLIBC"; return; fi
    getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}' || true
}

host_python_version() {
    if [ -n "${TFXKIT_HOST_PYTHON_VERSION:-}" ]; then echo "$TFXKIT_HOST_PYTHON_VERSION"; return; fi
    local py
    py=$(native_python) || return 0
    "$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])'
}

# The newest host Python that runs (pyenv shims may exist and fail).
native_python() {
    local py
    for py in python3.13 python3.12 python3.11 python3.10 python3; do
        if command -v "$py" >/dev/null && "$py" -c '' 2>/dev/null; then
            command -v "$py"
            return 0
        fi
    done
    return 1
}

# Native: the host itself installs the current stack's wheels.
native_ok() {
    local g p
    g=$(host_glibc); p=$(host_python_version)
    [ -n "$g" ] && version_ge "$g" "$MIN_GLIBC" && [ -n "$p" ] && case " $PYTHONS " in *" $p "*) true ;; *) false ;; esac
}

cmd_choose() {
    local g p why
    g=$(host_glibc); p=$(host_python_version)
    if native_ok; then
        echo "stack: current (TFX 1.21): host glibc $g >= $MIN_GLIBC and Python $p installs its wheels; STACK=1.16 chooses the other" >&2
        echo current
        return
    fi
    if [ -z "$g" ] || ! version_ge "$g" "$MIN_GLIBC"; then
        why="host glibc ${g:-unknown} < $MIN_GLIBC (TFX 1.21's ml-metadata and TFDV wheels)"
    else
        why="host Python ${p:-none} is not one of $PYTHONS"
    fi
    echo "stack: 1.16 (TFX 1.16): $why; STACK=current runs TFX 1.21 in a Debian 13 root (needs root and debootstrap)" >&2
    echo 1.16
}

# The mirror the host's apt sources name (read at run time, never stored).
host_mirror() {
    local f
    if [ -n "${TFXKIT_STACK_MIRROR:-}" ]; then echo "$TFXKIT_STACK_MIRROR"; return; fi
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -r "$f" ] || continue
        awk 'BEGIN{RS=""; FS="\n"}
             { uri=""; deb=0
               for (i=1;i<=NF;i++) {
                 if ($i ~ /^Types:/ && $i ~ /(^|[ \t])deb([ \t]|$)/) deb=1
                 if ($i ~ /^URIs:/) { split($i, a, /[ \t]+/); uri=a[2] } }
               if (deb && uri != "" && uri !~ /security/) { print uri; exit } }' "$f"
    done | head -1 | grep . && return
    cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
        awk '$1=="deb" { for (i=2;i<=NF;i++) if ($i ~ /^[a-z]+:\/\//) { if ($i !~ /security/) { print $i; exit } break } }' |
        head -1 | grep .
}

cannot_build() {
    echo "STACK=current cannot run here: this host's glibc $(host_glibc) is older than the $MIN_GLIBC TFX 1.21's wheels need, and the Debian 13 root that stands in for it cannot be built ($1); that needs root, debootstrap (apt-get install -y debootstrap) and a Debian mirror in the host's apt sources, or else use a host with glibc >= $MIN_GLIBC (Debian 13, Ubuntu 24.04) or STACK=1.16." >&2
    exit 1
}

root_complete() { [ "$(cat "$ROOT/.tfxkit-complete" 2>/dev/null)" = "$SUITE $PACKAGES" ]; }

cmd_root() {
    root_complete && return 0
    [ "$(id -u)" = 0 ] || cannot_build "not running as root"
    command -v "$DEBOOTSTRAP" >/dev/null || PATH=$PATH:/usr/sbin:/sbin
    # As the Makefile installs Fashion-MNIST: root with apt installs what is missing.
    if ! command -v "$DEBOOTSTRAP" >/dev/null && [ "$DEBOOTSTRAP" = debootstrap ] && command -v apt-get >/dev/null; then
        echo "stack-root: installing debootstrap (apt-get)" >&2
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; } \
            || cannot_build "debootstrap is not installed and apt-get could not install it"
    fi
    command -v "$DEBOOTSTRAP" >/dev/null || cannot_build "debootstrap is not installed"
    command -v unshare >/dev/null || cannot_build "unshare, from util-linux, is not installed"
    local mirror
    mirror=$(host_mirror) || cannot_build "no Debian mirror in /etc/apt/sources.list*"
    mkdir -p "$CACHE"
    exec 9>"$CACHE/.debian13.lock"
    flock 9
    root_complete && return 0
    # Leftovers of an interrupted build hold no mounts (those lived in its
    # namespace): plain directories, safe to delete.
    rm -rf "$ROOT" "$CACHE"/debian13.tmp.*
    local tmp start
    tmp=$(mktemp -d "$CACHE/debian13.tmp.XXXXXX")
    # mktemp makes it 0700: the root's / must let every user in.
    chmod 755 "$tmp"
    start=$(date +%s)
    echo "stack-root: building Debian 13 ($SUITE) root in $ROOT (about 70 s)" >&2
    if ! unshare --mount --propagation private -- \
        "$DEBOOTSTRAP" --variant=minbase --include="$PACKAGES" \
        "$SUITE" "$tmp" "$mirror" >"$CACHE/debootstrap.log" 2>&1; then
        rm -rf "$tmp"
        die "debootstrap failed; see $CACHE/debootstrap.log (nothing left half-built)"
    fi
    host_files "$tmp"
    echo "$SUITE $PACKAGES" >"$tmp/.tfxkit-complete"
    mv "$tmp" "$ROOT"
    echo "stack-root: root built in $(($(date +%s) - start)) s: $(chroot "$ROOT" sh -c 'ldd --version | head -1; python3 --version' | tr '\n' ' ')" >&2
}

# The host's resolver and CA bundle (which may name a proxy's CA), refreshed
# on every run.
host_files() {
    cp -L /etc/resolv.conf "$1/etc/resolv.conf"
    if [ -r /etc/ssl/certs/ca-certificates.crt ]; then
        cp -L /etc/ssl/certs/ca-certificates.crt "$1/etc/ssl/certs/ca-certificates.crt"
    fi
}

# One venv per clone (installed editable into it) and lock: <clone>-<lock>;
# a new lock's venv replaces the clone's older ones.
venv_prefix() {
    local repo_hash
    repo_hash=$(echo "$REPO" | sha256sum | cut -c1-8)
    if native_ok; then echo "$CACHE/venv-current-$repo_hash"; else echo "$CACHE/debian13-venv-$repo_hash"; fi
}

venv_dir() { echo "$(venv_prefix)-$(sha256sum <"$LOCK" | cut -c1-12)"; }

# Run "$@" in the root (or directly when native), repo at the same path, the
# cache bind-mounted at the same path for the venv and the download cache.
in_stack() {
    if native_ok; then
        "$@"
        return
    fi
    cmd_root
    host_files "$ROOT"
    # A worktree's git directory lies outside it: mounted too, at its own path.
    local git_dir
    git_dir=$(git -C "$REPO" rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)
    case "$git_dir" in "$REPO"/* | "") git_dir=$REPO ;; esac
    # A /tmp of this command's own, removed after it: TFX leaves a packaged copy
    # of each module file there (~50 MB a Trainer run), which would pile up in
    # the cached root from run to run.
    local run_tmp rc=0
    run_tmp=$(mktemp -d "$CACHE/run-tmp.XXXXXX")
    chmod 1777 "$run_tmp"
    # shellcheck disable=SC2064
    trap "rm -rf '$run_tmp'" EXIT
    # shellcheck disable=SC2016
    unshare --mount --propagation private -- bash -c '
        set -e
        root=$1 repo=$2 cache=$3 git_dir=$4 run_tmp=$5; shift 5
        # The root a mount point of its own: inside it / is one, so a nested
        # `unshare --mount` (tests use one for a size-limited tmpfs) can work.
        mount --bind "$root" "$root"
        mount --rbind /dev "$root/dev"
        mount -t proc proc "$root/proc"
        mount --rbind /sys "$root/sys"
        mkdir -p "$root$repo" "$root$cache"
        mount --bind "$repo" "$root$repo"
        mount --bind "$cache" "$root$cache"
        mount --bind "$run_tmp" "$root/tmp"
        if [ "$git_dir" != "$repo" ]; then
            mkdir -p "$root$git_dir"
            mount --bind "$git_dir" "$root$git_dir"
        fi
        # Debian dataset packages (dataset-fashion-mnist) installed on the host.
        if [ -d /usr/share/datasets ]; then
            mkdir -p "$root/usr/share/datasets"
            mount --bind /usr/share/datasets "$root/usr/share/datasets"
        fi
        cwd=$PWD; [ -d "$root$cwd" ] || cwd=$repo
        exec chroot "$root" /usr/bin/env -u VIRTUAL_ENV -u PYTHONHOME -u PYTHONPATH \
            PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
            LANG=C.UTF-8 /bin/sh -c "cd \"\$0\" && exec \"\$@\"" "$cwd" "$@"
    ' stack-root "$ROOT" "$REPO" "$CACHE" "$git_dir" "$run_tmp" "$@" || rc=$?
    rm -rf "$run_tmp"
    trap - EXIT
    return "$rc"
}

cmd_venv() {
    [ -f "$LOCK" ] || die "no $LOCK"
    local venv
    venv=$(venv_dir)
    if [ -f "$venv/.tfxkit-installed" ]; then
        # pyproject.toml changed: only the editable install is redone.
        [ "$REPO/pyproject.toml" -nt "$venv/.tfxkit-installed" ] || return 0
        in_stack "$venv/bin/uv" pip install -q --python "$venv/bin/python" --no-deps -e "$REPO"
        touch "$venv/.tfxkit-installed"
        return 0
    fi
    native_ok || cmd_root
    mkdir -p "$CACHE/downloads"
    local py start
    py=python3
    native_ok && py=$(native_python)
    start=$(date +%s)
    echo "stack-root: building $venv from requirements-current.lock" >&2
    # A venv's scripts name their own path, so it is built at its final path and
    # counts as built only once marked; an unmarked one is deleted and rebuilt.
    rm -rf "$venv"
    in_stack sh -c '
        set -e
        py=$1 venv=$2 cache=$3 lock=$4 repo=$5
        # The lock names the Python it was resolved for: another one is refused.
        want=$(sed -n "s/.*--python-version \([0-9.]*\).*/\1/p" "$lock" | head -1)
        have=$("$py" -c "import sys; print(\"%d.%d\" % sys.version_info[:2])")
        if [ "$want" != "$have" ]; then
            echo "stack-root: requirements-current.lock was resolved for Python $want, but this stack runs Python $have: re-lock with make lock STACK=current" >&2
            exit 1
        fi
        export UV_CACHE_DIR=$cache/downloads/uv PIP_CACHE_DIR=$cache/downloads/pip
        "$py" -m venv "$venv"
        uv_version=$(sed -n "s/^uv==//p" "$lock")
        nice -n 10 "$venv/bin/python" -m pip install -q --disable-pip-version-check "uv==$uv_version"
        nice -n 10 "$venv/bin/uv" pip sync -q --compile-bytecode --python "$venv/bin/python" "$lock"
        nice -n 10 "$venv/bin/uv" pip install -q --python "$venv/bin/python" --no-deps -e "$repo"
    ' venv "$py" "$venv" "$CACHE" "$LOCK" "$REPO"
    touch "$venv/.tfxkit-installed"
    local other
    for other in "$(venv_prefix)"-*; do
        [ "$other" = "$venv" ] || rm -rf "$other"
    done
    echo "stack-root: venv ready in $(($(date +%s) - start)) s" >&2
}

cmd_run() {
    [ $# -gt 0 ] || die "run: no command"
    cmd_venv
    local venv
    venv=$(venv_dir)
    in_stack /usr/bin/env PATH="$venv/bin:/usr/local/bin:/usr/bin:/bin" VIRTUAL_ENV="$venv" "$@"
}

case "${1:-}" in
    choose) cmd_choose ;;
    root) native_ok && echo "stack-root: host glibc $(host_glibc) needs no root" >&2 || cmd_root ;;
    venv) cmd_venv ;;
    venv-path) venv_dir ;;
    run) shift; cmd_run "$@" ;;
    *) die "usage: $0 choose|root|venv|venv-path|run CMD..." ;;
esac
