#!/usr/bin/env bash
# Builds outboxd's previous release once, from this clone's history, and prints the path
# of its binary. The rolling-upgrade test (tests/it/upgrades.rs) runs it beside this
# build; .ci/run builds it before the suite so the suite's own time does not include it.
#
# The release is named by its commit, not its tag: a clone made without tags still has it.
set -euo pipefail

release=0.2.0
commit=9ec7e4a1f4a5b6919984f7342effdb5402086de8

root=$(cd "$(dirname "$0")/../.." && pwd)
out="$root/target/previous-release/$release"
binary="$out/outboxd"

if [ ! -x "$binary" ]; then
    mkdir -p "$out"
    # One build at a time: the test and a developer's shell may both ask.
    exec 9>"$out.lock"
    flock 9
fi
if [ ! -x "$binary" ]; then
    if ! git -C "$root" cat-file -e "$commit^{commit}" 2>/dev/null; then
        echo "error: commit $commit (Release $release) is not in this clone's history:" \
             "fetch it with \`git fetch --unshallow\`" >&2
        exit 1
    fi
    rm -rf "$out/src" "$out/target"
    mkdir -p "$out/src"
    git -C "$root" archive "$commit" | tar -x -C "$out/src"
    # A package of its own, not a member of this checkout's workspace it sits inside.
    printf '\n[workspace]\n' >> "$out/src/Cargo.toml"
    # Its own lock file and target directory: its dependencies are not this build's.
    CARGO_TARGET_DIR="$out/target" cargo build --quiet --locked \
        --manifest-path "$out/src/Cargo.toml" --bin outboxd >&2
    cp "$out/target/debug/outboxd" "$binary.partial"
    mv "$binary.partial" "$binary"
    rm -rf "$out/src" "$out/target"
fi
echo "$binary"
