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
root=$(git rev-parse --show-toplevel)
pairs=()
for pair in "$@"; do   # SRC as the caller named it, made absolute before the cd to the repository's root
  src=${pair%%:*}; [ "$src" != "$pair" ] && [ -e "$src" ] && pair="$(realpath "$src"):${pair#*:}"; pairs+=("$pair")
done
set -- "${pairs[@]}"
cd "$root"
[ -z "$(git status --porcelain --untracked-files=no)" ] || { echo "keep_in_history: the tree has uncommitted changes; commit or stash them first"; exit 2; }
dests=()
for pair in "$@"; do
  src=${pair%%:*}; dest=${pair#*:}
  [ "$src" != "$pair" ] && [ -n "$dest" ] || { echo "keep_in_history: $pair is not SRC:DEST"; exit 2; }
  [ -f "$src" ] || { echo "keep_in_history: $src is not a file"; exit 2; }
  case "$dest" in /*|*..*) echo "keep_in_history: DEST must be a relative path inside kept/, got $dest"; exit 2;; esac
  if git cat-file -e "HEAD:kept/$dest" 2>/dev/null; then echo "keep_in_history: kept/$dest is in the tree already"; exit 2; fi
  mkdir -p "kept/$(dirname "$dest")"
  cp "$src" "kept/$dest"
  git add -f "kept/$dest"
  dests+=("$dest")
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
  echo "kept: git show $sha:kept/$dest > $(basename "$dest")"
done
git add "$index"
git commit -q -m "kept/ out of the tree again ($msg: in $sha, listed in $index)"
