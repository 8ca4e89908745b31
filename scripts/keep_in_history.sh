#!/usr/bin/env bash
# Keep large files (training stages, trained models: 37 MB each) in main's history without leaving them in its
# tree. Why: only main survives a move to a new machine (session 35 found the side branch quality-stages, with
# the operating-point models, stages and logs, gone with the old machine), and main's tree is what every device
# call carries within 64 MiB beside its wheels, so a 37 MB file cannot stay in it.
#   bash scripts/keep_in_history.sh "what these are" SRC:DEST [SRC:DEST ...]
# Two commits on the current branch: the first adds each SRC at kept/DEST, the second removes kept/ from the tree
# again; the index docs/kept_in_history.md gains one line per file with the first commit's hash, so a later
# session gets it back with
#   git show <sha>:kept/DEST > FILE
# Needs a clean tree (the two commits hold nothing else). The first commit is in history for good: keep files
# only when they are worth their bytes in every clone (the stage a next GPU session resumes from, a model a result
# was measured on).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: keep_in_history.sh MESSAGE SRC:DEST [SRC:DEST ...]"; exit 2; }
msg=$1; shift
refuse() { echo "keep_in_history: $*"; exit 2; }
case "$msg" in *$'\n'*|*'|'*) refuse "MESSAGE goes into a table row: no newline and no '|'";; esac
root=$(git rev-parse --show-toplevel)
# every pair checked before anything is copied: a refusal leaves the tree as it was
srcs=(); dests=()
for pair in "$@"; do
  src=${pair%%:*}; dest=${pair#*:}
  [ "$src" != "$pair" ] && [ -n "$src" ] && [ -n "$dest" ] || refuse "$pair is not SRC:DEST"
  [ -f "$src" ] || refuse "$src is not a file"          # SRC as the caller named it, from the caller's directory
  # DEST a plain relative path: no empty, '.' or '..' part, no glob characters (git would read them as a pattern)
  IFS=/ read -ra parts <<< "$dest"
  for part in "${parts[@]}"; do
    case "$part" in ''|.|..) refuse "DEST must be a plain relative path inside kept/, got $dest";; esac
  done
  case "$dest" in /*|*/|*[\*\?\[]*) refuse "DEST must be a plain relative path inside kept/, got $dest";; esac
  srcs+=("$(realpath "$src")"); dests+=("$dest")
done
cd "$root"
[ -z "$(git status --porcelain --untracked-files=no)" ] || refuse "the tree has uncommitted changes; commit or stash them first"
[ ! -e kept ] || refuse "kept/ exists in the working tree; move it away first (this script makes and removes it)"
start=$(git rev-parse HEAD)
# from here on a failure puts the branch and the tree back where they were
trap 'echo "keep_in_history: failed; back to $start"; git reset -q --hard "$start"; rm -rf kept' ERR
for i in "${!dests[@]}"; do
  mkdir -p "kept/$(dirname "${dests[$i]}")"
  cp "${srcs[$i]}" "kept/${dests[$i]}"
  git add -f -- ":(literal)kept/${dests[$i]}"
done
git commit -q -m "kept in history (then removed from the tree): $msg"
sha=$(git rev-parse --short=12 HEAD)
git rm -rq kept
rm -rf kept
index=docs/kept_in_history.md
if [ ! -f "$index" ]; then
  mkdir -p docs
  printf '%s\n' "# Files kept in main's history, not in its tree" "" \
    "Written by \`scripts/keep_in_history.sh\` (why: its header). Get one back with \`git show SHA:PATH > FILE\`." "" \
    "| commit | path | bytes | sha256 | what |" "|---|---|---:|---|---|" > "$index"
fi
for dest in "${dests[@]}"; do
  bytes=$(git cat-file -s "$sha:kept/$dest")
  sum=$(git show "$sha:kept/$dest" | sha256sum | cut -c1-16)
  echo "| $sha | kept/$dest | $bytes | $sum | $msg |" >> "$index"
done
git add "$index"
git commit -q -m "kept/ out of the tree again ($msg: in $sha, listed in $index)"
trap - ERR
for dest in "${dests[@]}"; do echo "kept: git show '$sha:kept/$dest' > '$(basename "$dest")'"; done
